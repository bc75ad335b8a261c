"""How far two correct FP32 runs of one network may differ, and detection matching that respects it.

Two correct FP32 evaluations of the same weights (PyTorch vs ONNX Runtime, oneDNN's AVX-512 kernels vs
its AVX2 ones, our model vs Ultralytics') differ only in the order in which each convolution adds up its
terms. The bounds here are derived from that, never measured on one CPU:

* one K-term sum added in another order moves by about ``sqrt(K) * eps`` of its magnitude (the rounding
  errors of the two orders behave like a random walk of K steps of at most eps/2 each);
* BatchNorm keeps each layer's gain near 1, so the errors of successive layers add up: at most
  ``depth * sqrt(K) * eps`` relative, with ``depth`` = the number of convolutions (more than the longest
  path through the network) and ``K`` = the largest fan-in of any of them;
* the head's decode then maps a logit error onto scores (sigmoid slope <= 1/4) and onto boxes (DFL
  expectation, see :func:`fp32_tolerance`).

After NMS a detection may legitimately exist on one side only when it sits on a threshold: its score is
within the score tolerance of the confidence threshold or of the last kept score of a full list, or a
kept box of the same class could have suppressed it on the other side (their IoU could reach the NMS
threshold once the box moves by the box tolerance). :func:`assert_same_detections` excuses exactly those.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torchvision.ops import box_iou

from detector.model.attention import Attention
from detector.postprocess import NMSConfig

FP32_EPS = torch.finfo(torch.float32).eps  # 1.19e-7: the gap between 1.0 and the next float32

Detections = Sequence[dict[str, torch.Tensor]]  # per image: boxes [N, 4] xyxy px, scores [N], labels [N]


def summed_layers(model: nn.Module) -> int:
    """The layers that add up products: every convolution, and YOLO11's attention's two matrix products (queries
    by keys, weights by values: each a sum as a convolution's is)."""
    return (sum(isinstance(module, nn.Conv2d) for module in model.modules())
            + 2 * sum(isinstance(module, Attention) for module in model.modules()))


def fp32_relative_error(model: nn.Module) -> float:
    """``depth * sqrt(K) * eps``: the relative change of the outputs that summation order alone can cause."""
    convs = [module for module in model.modules() if isinstance(module, nn.Conv2d)]
    # in_channels / groups * kh * kw; an attention product's sums run over a head's key width (at most its
    # channels, below the convolution before it) or over the map's positions (400 at 640 px: below YOLO11n's
    # largest fan-in, 2,304)
    terms = max(conv.weight[0].numel() for conv in convs)
    return summed_layers(model) * math.sqrt(terms) * FP32_EPS


def rounded_relative_error(model: nn.Module, eps: float) -> float:
    """``depth * eps`` for a run that rounds weights and activations to a format with machine epsilon ``eps``.

    FP16 storage (eps 2^-10) or TF32 convolution inputs (10-bit mantissa, eps 2^-10) round every weight and
    every activation to eps/2 relative, so each layer adds at most eps relative (sums still accumulate in
    FP32, whose order error is 1000x smaller); the errors of successive layers add up.
    """
    return summed_layers(model) * eps


@dataclass(frozen=True)
class Tolerance:
    """Largest legitimate differences: raw head output, sigmoid score, decoded coordinate (px)."""

    logit: float
    score: float
    box: float


def fp32_tolerance(
    model: nn.Module, raw: Sequence[torch.Tensor], *, image_size: int, relative: float | None = None
) -> Tolerance:
    """Tolerances for ``model`` from its own raw outputs (``[B, 4*reg_max + C, H, W]`` per level).

    * logit: relative error (:func:`fp32_relative_error` unless given) times the largest raw output;
    * score: sigmoid's slope is at most 1/4, so a score moves by at most a quarter of its logit's error;
    * box: a side's distance is ``stride * E`` with ``E = sum_k p_k k`` over the softmax ``p`` of its
      ``reg_max`` bin logits; its derivative along logit k is ``stride * p_k (k - E)``, so bin logits that
      each move by at most dl move it by at most ``stride * dl * sum_k p_k |k - E|``. The sum is the mean
      absolute deviation of the model's own bin distribution (at most (reg_max - 1) / 2, near 0 where one
      bin dominates) and dl is the relative error times that side's largest bin logit; the bound is taken
      at its largest over all anchors and sides. Anchor +- distance then rounds once more: eps times the
      coordinate, at most the image side plus the longest distance, (reg_max - 1) * the largest stride.
    * box with ``reg_max`` 1 (YOLO26: the distance is the raw value ``d`` itself, in grid units): a side is
      ``stride * d``, so it moves by ``stride * dl`` with dl the relative error times ``|d|``; the bound is taken at
      its largest over all anchors and sides, then the same final rounding, the longest distance being the largest
      ``stride * |d|``.
    """
    reg_max = model.reg_max
    relative = fp32_relative_error(model) if relative is None else relative
    box_logits = max(float(level[:, : 4 * reg_max].abs().max()) for level in raw)
    class_logits = max(float(level[:, 4 * reg_max :].abs().max()) for level in raw)
    logit = relative * max(box_logits, class_logits)
    if reg_max == 1:
        longest = max(stride * float(level[:, :4].float().abs().max()) for level, stride in zip(raw, model.strides))
        box = relative * longest + FP32_EPS * (image_size + longest)
        return Tolerance(logit=logit, score=relative * class_logits / 4, box=box)
    bins = torch.arange(reg_max, dtype=torch.float32)
    box = 0.0
    for level, stride in zip(raw, model.strides):
        side_logits = level[:, : 4 * reg_max].float().unflatten(1, (4, reg_max)).movedim(2, -1)  # [B, 4, H, W, bins]
        probs = side_logits.softmax(-1)
        deviation = (probs * (bins - (probs * bins).sum(-1, keepdim=True)).abs()).sum(-1)
        box = max(box, stride * relative * float((deviation * side_logits.abs().amax(-1)).max()))
    box += FP32_EPS * (image_size + (reg_max - 1) * max(model.strides))
    return Tolerance(logit=logit, score=relative * class_logits / 4, box=box)


def _expanded(boxes: torch.Tensor, delta: float) -> torch.Tensor:
    return boxes + torch.tensor([-delta, -delta, delta, delta], dtype=boxes.dtype)


def _shrunk(boxes: torch.Tensor, delta: float) -> torch.Tensor:
    centres = (boxes[:, :2] + boxes[:, 2:]) / 2
    low = torch.minimum(boxes[:, :2] + delta, centres)
    return torch.cat((low, torch.maximum(boxes[:, 2:] - delta, centres)), 1)


def _intersection(boxes: torch.Tensor, others: torch.Tensor) -> torch.Tensor:
    top_left = torch.maximum(boxes[:, None, :2], others[None, :, :2])
    bottom_right = torch.minimum(boxes[:, None, 2:], others[None, :, 2:])
    return (bottom_right - top_left).clamp(min=0).prod(-1)


def _area(boxes: torch.Tensor) -> torch.Tensor:
    return (boxes[:, 2:] - boxes[:, :2]).prod(-1)


def max_iou_within(boxes: torch.Tensor, others: torch.Tensor, delta: float) -> torch.Tensor:
    """``[N, M]`` upper bound of IoU(b', o) over every b' whose coordinates are within ``delta`` of b.

    Any such b' lies inside b grown by delta and contains b shrunk by delta, so its intersection with o is
    at most the grown box's and its union with o at least the shrunk box's.
    """
    grown, shrunk = _expanded(boxes, delta), _shrunk(boxes, delta)
    union = _area(shrunk)[:, None] + _area(others)[None, :] - _intersection(shrunk, others)
    return _intersection(grown, others) / union.clamp(min=1e-12)


@dataclass
class MatchSummary:
    compared: int = 0  # detections clearly above every threshold, on either side
    matched: int = 0
    excused: int = 0  # borderline: may exist on one side only
    max_box_diff: float = 0.0
    max_score_diff: float = 0.0


def _one_way(
    side: dict[str, torch.Tensor], other: dict[str, torch.Tensor], nms: NMSConfig, tolerance: Tolerance,
    box_slack: float, tie_swaps: bool, summary: MatchSummary, failures: list[str], where: str,
) -> None:
    boxes, scores, labels = (side[key].detach().float().cpu() for key in ("boxes", "scores", "labels"))
    other_boxes, other_scores, other_labels = (other[key].detach().float().cpu() for key in ("boxes", "scores", "labels"))
    floor = nms.conf_threshold + tolerance.score  # below it, the other side may have dropped the box
    if len(other_scores) >= nms.max_detections:  # a full list: the other side may have cut it at the end
        floor = max(floor, float(other_scores.min()) + tolerance.score)
    same_class = labels[:, None] == other_labels[None, :]
    # close[i, j]: other detection j agrees with detection i within the tolerances
    box_gap = (boxes[:, None] - other_boxes[None, :]).abs().amax(-1) if len(boxes) and len(other_boxes) else \
        torch.zeros(len(boxes), len(other_boxes))
    close = same_class & (box_gap <= tolerance.box) & ((scores[:, None] - other_scores[None, :]).abs() <= tolerance.score)
    iou = box_iou(boxes, other_boxes) if len(other_boxes) else torch.zeros(len(boxes), 0)
    iou = torch.where(same_class, iou, torch.full_like(iou, -1.0))
    could_suppress = same_class & (max_iou_within(boxes, other_boxes, tolerance.box + box_slack) > nms.iou_threshold)
    outranks = other_scores[None, :] >= scores[:, None] - tolerance.score
    for index in (scores > floor).nonzero().flatten().tolist():
        summary.compared += 1
        if iou.shape[1] and float(iou[index].max()) > 0:
            partner = int(iou[index].argmax())  # the same-class box of highest IoU
            if close[index, partner]:
                summary.matched += 1
                summary.max_box_diff = max(summary.max_box_diff, float(box_gap[index, partner]))
                summary.max_score_diff = max(summary.max_score_diff, abs(float(scores[index] - other_scores[partner])))
                continue
        # Suppressed on the other side by a box kept on both sides (so not this one's own counterpart, moved)
        # whose IoU with it sits on the NMS threshold.
        kept_on_both = torch.cat((close[:index], close[index + 1 :])).any(0)
        if bool((could_suppress[index] & outranks[index] & kept_on_both).any()):
            summary.excused += 1
            continue
        # Ties: where scores tie within the tolerance NMS may keep either box, and a swap cascades (B kept
        # instead of A then suppresses C, which A had left alone). So after a tie, the other side may lack this
        # box wherever it kept any same-class box that outranks it and overlaps it past the NMS threshold: the
        # NMS rule itself. Only sound where the caller has already compared the raw outputs anchor by anchor,
        # since then no box can have moved and excused itself through its own moved copy.
        if tie_swaps and bool((could_suppress[index] & outranks[index]).any()):
            summary.excused += 1
            continue
        failures.append(f"{where}: detection {index} (label {int(labels[index])}, score {float(scores[index]):.6f}, "
                        f"box {boxes[index].tolist()}) has no partner within {tolerance}")


def assert_same_detections(
    expected: Detections, got: Detections, *, nms: NMSConfig, tolerance: Tolerance, box_slack: float = 0.0,
    tie_swaps: bool = False,
) -> MatchSummary:
    """Every detection of either side clearly above the thresholds has a same-class partner on the other.

    Partners are found by IoU (``torchvision.ops.box_iou``), not by index, and must agree within
    ``tolerance``; ``box_slack`` (px) widens only the NMS-borderline test, for an NMS whose own IoU
    arithmetic rounds more coarsely than the boxes it is given. ``tie_swaps`` also excuses a detection
    that overlaps a near-tied one kept on the other side; pass it only after comparing the raw outputs.
    """
    assert len(expected) == len(got)
    summary, failures = MatchSummary(), []
    for image, (first, second) in enumerate(zip(expected, got)):
        _one_way(first, second, nms, tolerance, box_slack, tie_swaps, summary, failures, f"image {image} expected->got")
        _one_way(second, first, nms, tolerance, box_slack, tie_swaps, summary, failures, f"image {image} got->expected")
    assert not failures, "\n".join(failures)
    assert summary.matched > 0, "no detection clearly above the thresholds: the comparison would be vacuous"
    return summary


def fp32_tolerance_on(model: nn.Module, images: torch.Tensor, *, relative: float | None = None) -> Tolerance:
    """:func:`fp32_tolerance` for ``model`` on uint8 ``images [B, 3, H, W]`` (scaled to [0, 1] as every backend does)."""
    with torch.no_grad():
        raw = model.eval()(images.float() / 255)
    return fp32_tolerance(model, raw, image_size=max(images.shape[-2:]), relative=relative)
