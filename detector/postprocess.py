"""Raw head maps -> final detections: DFL decode, confidence filter, class-aware NMS (or, for an end-to-end head,
the NMS-free top-k of :mod:`detector.topk`)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from detector.boxes import box_iou, dfl_expectation, distances_to_boxes, flatten_head_outputs, make_anchors
from detector.nms import COORDINATE_LIMIT, batched_nms
from detector.topk import top_k_detections


def decode_outputs(outputs: list[torch.Tensor], strides: tuple[int, ...], reg_max: int) -> torch.Tensor:
    """Raw maps -> ``[B, A, 4 + C]``: xyxy boxes in input pixels, then per-class sigmoid scores."""
    # Level by level, then one concatenation of the small results: the same values (bit for bit on this CPU) as
    # decoding the levels' concatenation, without first copying every raw map into it. Eagerly, at 640 px on a
    # 2-core CPU: 2.4-4.9 against 5.7-6.6 ms per image at batch 1, 4.0-4.2 against 4.8-4.9 at batch 16 (at 320 px
    # both take 0.46). Compiled, Inductor had fused that copy and the softmax into a scalar loop.
    levels = []
    for output, level_stride in zip(outputs, strides):
        flat = flatten_head_outputs([output]).float()
        points, stride = make_anchors([output.shape[2:]], (level_stride,), device=flat.device, dtype=flat.dtype)
        boxes = distances_to_boxes(points, dfl_expectation(flat[..., : 4 * reg_max], reg_max)) * stride
        levels.append(torch.cat((boxes, flat[..., 4 * reg_max :].sigmoid()), -1))
    return torch.cat(levels, 1)


@dataclass(frozen=True)
class NMSConfig:
    conf_threshold: float = 0.25  # drop candidates below this class score
    iou_threshold: float = 0.7  # suppress same-class boxes overlapping more than this
    max_detections: int = 300  # keep at most this many per image
    max_candidates: int = 30000  # cap on boxes that enter NMS (bounds worst-case time)
    multi_label: bool = False  # one candidate per (box, class) above threshold, as COCO eval expects
    agnostic: bool = False  # boxes of every class suppress each other (predict --agnostic-nms); labels are kept
    # No NMS: each image's best max_detections (box, class) pairs above conf_threshold (detector/topk.py), for a
    # YOLO26 one-to-one head (--end-to-end); multi-label by nature, one pair per box with agnostic; no iou_threshold.
    end_to_end: bool = False


def nms_groups(labels: torch.Tensor, config: NMSConfig) -> torch.Tensor:
    """What NMS keeps apart: each class, or with ``agnostic`` nothing (one group; the labels stay the results')."""
    return torch.zeros_like(labels) if config.agnostic else labels


def above_conf(
    decoded: torch.Tensor, config: NMSConfig
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor, torch.Tensor, torch.Tensor]:
    """``[..., A, 4 + C]`` decoded predictions (one image, or a batch) -> the (box, class) pairs above the confidence
    threshold, in order: (their indices over the leading dims, boxes ``[N, 4]``, scores ``[N]``, labels ``[N]``).
    ``multi_label``: every class above it; else each box's best class, where that is above it. A box with a NaN or
    infinite coordinate (a diverging model's) is never a candidate: in torchvision's batched NMS one such box turns
    every box of its call into NaN (its class offsets scale with the largest coordinate) and suppresses nothing."""
    class_scores = decoded[..., 4:]
    finite = decoded[..., :4].isfinite().all(-1)
    if config.multi_label:
        *rows, labels = ((class_scores > config.conf_threshold) & finite.unsqueeze(-1)).nonzero(as_tuple=True)
        scores = class_scores[(*rows, labels)]
    else:
        best, best_label = class_scores.max(-1)
        rows = ((best > config.conf_threshold) & finite).nonzero(as_tuple=True)
        scores, labels = best[rows], best_label[rows]
    return tuple(rows), decoded[..., :4][tuple(rows)], scores, labels


def candidates(image_preds: torch.Tensor, config: NMSConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One image's ``[A, 4 + C]`` -> the (boxes ``[N, 4]``, scores ``[N]``, labels ``[N]``) that enter NMS."""
    _, boxes, scores, labels = above_conf(image_preds, config)
    # Top-k before NMS, as Ultralytics' max_nms=30000: bounds NMS's worst case. It changes the result only
    # for an image with more than max_candidates (box, class) pairs above conf, e.g. 8400 anchors x 80
    # classes at conf 0.001 on a barely trained model; then the lowest-scoring ones never enter NMS.
    if scores.numel() > config.max_candidates:
        top = scores.topk(config.max_candidates).indices
        boxes, scores, labels = boxes[top], scores[top], labels[top]
    return boxes, scores, labels


def non_max_suppression(decoded: torch.Tensor, config: NMSConfig = NMSConfig()) -> list[dict[str, torch.Tensor]]:
    """``[B, A, 4 + C]`` decoded predictions -> per image ``{boxes [N,4] xyxy px, scores [N], labels [N]}``.

    On the CPU, one ``batched_nms`` per image, on purpose: one call for the whole batch (groups = image x
    class) measured slower on CPU, 2.6x on the built-in data (benchmarks/val_speed.py) and 10x at 80 classes,
    because torchvision's large-input path masks every candidate once per group, O(groups x candidates).
    On CUDA the opposite holds (a launch per image costs more than the kernel): one call for the batch,
    :func:`batched_non_max_suppression`.
    ``config.end_to_end``: no NMS, the top-k of :func:`detector.topk.top_k_detections` instead.
    """
    if config.end_to_end:
        return _top_k(decoded, config)
    if decoded.is_cuda:
        return batched_non_max_suppression(decoded, config)
    # The candidates here, on torch's intra-op threads (their [anchors, classes] tensors are large enough to run in
    # parallel); then NMS itself, which torchvision runs on one core, releasing the GIL: images side by side, one
    # per intra-op thread's core (a pool per call, so no thread outlives it into a later fork of loader workers).
    # Validation's worst case (benchmarks/val_speed.py, 128 images, every pair above conf, 2 cores): NMS 0.89 s ->
    # 0.53 s per pass.
    per_image = [candidates(image_preds, config) for image_preds in decoded]
    threads = min(torch.get_num_threads(), len(per_image))
    if threads < 2:
        return [_kept(*image, config) for image in per_image]
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda image: _kept(*image, config), per_image))


def _top_k(decoded: torch.Tensor, config: NMSConfig) -> list[dict[str, torch.Tensor]]:
    return top_k_detections(decoded, conf_threshold=config.conf_threshold, max_detections=config.max_detections,
                            agnostic=config.agnostic)


def grouped_nms(boxes: torch.Tensor, scores: torch.Tensor, groups: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """torchvision's ``batched_nms`` (boxes of different groups never suppress each other), computed in FP64, over
    the boxes ordered by score, descending, equal scores by index; returns the kept indices in that order.

    Below its size limit (1,000 boxes on the CPU, 25,000 on CUDA) torchvision runs one NMS over boxes shifted by
    group x (largest coordinate + 1). With groups = image x class at 32 images x 80 classes that shift reaches
    ~1.8e6 px, where FP32 coordinates are 0.125 px apart: a small box near the IoU threshold was kept or suppressed
    depending on where its image sat in the batch (3-8 of ~710 kept boxes differed from each group's own NMS in
    tests/test_postprocess.py). FP64 resolves 2**-32 px there; the cast of a few thousand boxes costs nothing
    beside NMS, whose kernels take FP64 on the CPU and CUDA.

    NMS reads the scores only to order the boxes, so it gets that order itself, as distinct ranks: of two
    overlapping boxes with equal scores (FP16 scores have ~1,000 values between 0.5 and 1) the first in the order
    is kept, and torchvision would order equal scores by a sort of its own, whose outcome may depend on the whole
    set of boxes (its CUDA sort is not promised stable). With the ranks, the boxes kept are the same on either
    device, in one batched call or per image, and in a first pass over part of the set
    (:data:`FIRST_PASS_CANDIDATES`) as over all of it.
    """
    order = scores.sort(descending=True, stable=True).indices
    ranks = torch.empty(len(order), dtype=torch.float64, device=scores.device)
    ranks[order] = torch.arange(len(order), 0, -1, dtype=torch.float64, device=scores.device)  # distinct, exact
    return batched_nms(boxes.double(), ranks, groups, iou_threshold)  # by rank, descending: torchvision's promise


# NMS runs first over each image's best this many candidates (at least max_detections). Greedy NMS decides a box
# by the boxes scored at least as high alone, so the boxes it keeps from a score-ordered prefix are exactly those the
# whole run keeps from that prefix; when max_detections of them score above the prefix's lowest, they are the whole
# run's answer (:func:`settled`), else NMS runs again over every candidate. At conf 0.001 a barely trained model
# gives an image up to 30,000 candidates (all 8,400 anchors x 3 classes of BCCD's at 640 px; capped by
# max_candidates): NMS compares every pair of each class, and on CUDA torchvision then walks the candidates one by
# one in a single thread block.
FIRST_PASS_CANDIDATES = 3000


def first_pass_size(config: NMSConfig) -> int:
    return max(FIRST_PASS_CANDIDATES, config.max_detections)


def settled(kept_scores: torch.Tensor, lowest: torch.Tensor | float, max_detections: int) -> bool:
    """Whether the first pass's kept scores (best first, at most ``max_detections``) are the whole run's: it kept
    ``max_detections`` boxes, all scored above ``lowest``, the lowest candidate it saw. Any candidate it did not see
    scores at most ``lowest``, so it neither outranks them nor suppresses one of them."""
    return len(kept_scores) == max_detections and bool(kept_scores[-1] > lowest)


def _kept(
    boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, config: NMSConfig
) -> dict[str, torch.Tensor]:
    first = first_pass_size(config)
    if len(scores) > first:  # the image's best first (FIRST_PASS_CANDIDATES)
        top = scores.topk(first)  # best first: its last value is the lowest score the first pass sees
        # In their own order, as the whole run has them: of two equal-scored boxes, the one first in it comes first
        # in NMS's order too (grouped_nms), so the same one is kept.
        chosen = top.indices.sort().values
        kept = _kept_all(boxes[chosen], scores[chosen], labels[chosen], config)
        if settled(kept["scores"], top.values[-1], config.max_detections):
            return kept
    return _kept_all(boxes, scores, labels, config)


def _kept_all(
    boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, config: NMSConfig
) -> dict[str, torch.Tensor]:
    keep = grouped_nms(boxes, scores, nms_groups(labels, config), config.iou_threshold)[: config.max_detections]
    return {"boxes": boxes[keep], "scores": scores[keep], "labels": labels[keep]}


# batched_nms runs one NMS over class-offset boxes up to 100,000 coordinates (25,000 boxes) on CUDA; above that it
# loops over every group (image x class), a host sync each: early in training, at conf 0.001, a batch of 16 holds
# ~134,000 candidates. So the batch goes in chunks of whole images under that.
ONE_CALL_BOXES = COORDINATE_LIMIT // 4


def image_chunks(counts: list[int], limit: int) -> list[range]:
    """Consecutive images grouped so that each group's candidates stay within ``limit`` (an image above it alone)."""
    chunks, start, total = [], 0, 0
    for image, count in enumerate(counts):
        if image > start and count and total + count > limit:
            chunks.append(range(start, image))
            start, total = image, 0
        total += count
    return chunks + [range(start, len(counts))] if counts else chunks


def batched_non_max_suppression(decoded: torch.Tensor, config: NMSConfig = NMSConfig()) -> list[dict[str, torch.Tensor]]:
    """:func:`non_max_suppression` with one ``batched_nms`` call per chunk of images (:func:`image_chunks`;
    groups = image x class). The same result: boxes of different images or classes never suppress each other.

    Built for the GPU, where each host read waits for the device: the candidates of the whole batch come from one
    ``nonzero`` (image-major, so in each image's own order), and each chunk's kept indices are grouped by image
    with one stable sort, so a batch costs a handful of host reads instead of several per image (at batch 32,
    ~200). Only an image with more than ``max_candidates`` candidates takes :func:`candidates`' top-k, per image;
    with more than :func:`first_pass_size`, NMS runs over its best first (:func:`_first_pass_then_rest`).
    """
    if config.end_to_end:  # no NMS: the top-k, batched on any device (detector/topk.py)
        return _top_k(decoded, config)
    batch, num_classes = decoded.shape[0], decoded.shape[-1] - 4
    (image, _), boxes, scores, labels = above_conf(decoded, config)
    counts = torch.bincount(image, minlength=batch).tolist()
    if any(count > config.max_candidates for count in counts):  # rare: top-k per image, as candidates() does
        per_image = [candidates(image_preds, config) for image_preds in decoded]
        counts = [len(image_scores) for _, image_scores, _ in per_image]
        boxes, scores, labels = (torch.cat([part[i] for part in per_image]) for i in range(3))
        image = torch.repeat_interleave(torch.arange(batch, device=decoded.device),
                                        torch.tensor(counts, device=decoded.device), output_size=sum(counts))
    if any(count > first_pass_size(config) for count in counts):
        return _first_pass_then_rest(boxes, scores, labels, image, counts, num_classes, config)
    return _in_chunks(boxes, scores, labels, image, counts, num_classes, config)


def _in_chunks(boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, image: torch.Tensor,
               counts: list[int], num_classes: int, config: NMSConfig) -> list[dict[str, torch.Tensor]]:
    """Each image's detections from candidates in runs of one image each (``image``: 0 to len(counts) - 1, in
    order; ``counts``: each run's length), one ``batched_nms`` per chunk of images (:func:`image_chunks`)."""
    if use_fixed_point(boxes, counts):
        settled = _fixed_point(boxes, scores, labels, image, counts, config)
        if settled is not None:
            return settled
    results = []
    offsets = [0, *itertools.accumulate(counts)]
    for chunk in image_chunks(counts, ONE_CALL_BOXES):
        first, last = offsets[chunk.start], offsets[chunk.stop]  # the chunk's candidates are one run
        results.extend(_one_call(boxes[first:last], scores[first:last], labels[first:last], image[first:last],
                                 chunk, num_classes, config))
    return results


# On CUDA, images of at most this many candidates (the first pass's size: every first pass, and any image with
# fewer) go through fixed_point_nms, all at once, instead of torchvision's kernel, which walks each call's
# candidates one by one in a single thread block: 139 ms of a 446-ms BCCD validation pass on an H200 (docs/gpu.md),
# the same whether a call held one image or eight. 0 turns it off.
FIXED_POINT_CANDIDATES = FIRST_PASS_CANDIDATES
# Fewer candidates in the batch than this go to torchvision's kernel: its walk takes ~0.5 us a candidate on an H200
# (139 ms over 87 images of ~3,000), so ~0.5 ms here, about what fixed_point_nms's ~40 kernel launches and a host read
# a step cost; predict at conf 0.25 (batch 1: 2.0 ms in all on an H100) stays on the path measured there.
FIXED_POINT_FROM = 1000
# Steps fixed_point_nms may take before the batch goes to torchvision's kernel instead: each is a matrix product over
# the batch's [images, candidates, candidates] overlaps. A trained BCCD model's candidates took 18.
FIXED_POINT_STEPS = 64


def use_fixed_point(boxes: torch.Tensor, counts: list[int]) -> bool:
    """Whether a batch's candidates (``counts`` an image) go through :func:`_fixed_point`: on CUDA, within the sizes
    above."""
    return boxes.is_cuda and max(counts, default=0) <= FIXED_POINT_CANDIDATES and sum(counts) >= FIXED_POINT_FROM


def _fixed_point(boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, image: torch.Tensor,
                 counts: list[int], config: NMSConfig) -> list[dict[str, torch.Tensor]] | None:
    """:func:`_in_chunks`' answer from :func:`fixed_point_nms` over every image at once (each image's
    candidates padded to the most any has, best first), or None if it did not settle in ``FIXED_POINT_STEPS``."""
    batch, width, device = len(counts), max(counts), boxes.device
    order, slot = best_first_by_image(image, scores, counts)  # grouped_nms's order, image by image
    where = (image[order], slot)
    padded = torch.full((batch, width), -1, dtype=torch.int64, device=device)  # candidate index, -1: padding
    padded[where] = order
    valid = padded >= 0
    padded_boxes = torch.zeros((batch, width, 4), dtype=boxes.dtype, device=device)
    padded_boxes[where] = boxes[order]
    padded_labels = torch.full((batch, width), -1, dtype=labels.dtype, device=device)
    padded_labels[where] = nms_groups(labels, config)[order]
    keep = fixed_point_nms(padded_boxes, padded_labels, valid, config.iou_threshold, max_iterations=FIXED_POINT_STEPS)
    if keep is None:
        return None
    keep &= keep.cumsum(1) <= config.max_detections  # each image's best max_detections
    selected = padded[keep]  # row by row: image-major, best first
    sizes = keep.sum(1).tolist()
    parts = (boxes[selected].split(sizes), scores[selected].split(sizes), labels[selected].split(sizes))
    return [{"boxes": b, "scores": s, "labels": c} for b, s, c in zip(*parts)]


# Pairs of boxes whose overlap fixed_point_nms computes in one go: box_iou's FP64 intermediates take 8 bytes a pair
# (~64 MB at this size, a few alive at a time). At least one row (image) a go, whatever its size: 9M pairs for 3,000.
PAIRS_AT_ONCE = 8 * 2**20
# Pairs of boxes one fixed point is found over: its suppression matrix takes 2 bytes a pair on CUDA (~320 MB at this
# size; 16 images of 3,000 candidates are 144M pairs). Rows beyond it are solved in further groups, a host read a step.
PAIRS_PER_SOLVE = 160 * 2**20


def fixed_point_nms(
    boxes: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor, iou_threshold: float, *, max_iterations: int
) -> torch.Tensor | None:
    """Greedy NMS of each row of a batch at once, in tensor operations: which boxes are kept, bool ``[B, N]``, or
    None where that takes more than ``max_iterations`` steps (the caller then runs torchvision's kernel).

    ``boxes``: xyxy ``[B, N, 4]``, each row's best first; ``labels``: ``[B, N]`` (boxes of different labels never
    suppress each other); ``valid``: ``[B, N]``, False for a row's padding. Greedy NMS keeps a box unless a kept box
    before it of its label overlaps it by more than ``iou_threshold``: one pass in that order, which torchvision's
    CUDA kernel walks box by box in one thread block (139 ms of a 446-ms BCCD validation pass on an H200,
    docs/gpu.md). Here every pair's overlap is computed at once, and ``keep = valid and not (any kept box before it
    overlaps it)`` is iterated from ``keep = valid``: that rule determines the first box, then the second, and so on,
    so a fixed point of it is the greedy answer, reached after at most as many steps as the longest chain of boxes
    each suppressing the next (18 on a trained BCCD model's candidates, 4-7 on random ones) plus one that sees
    nothing change (Cluster-NMS, Zheng et al. 2020). The overlap is torchvision's (:func:`detector.boxes.box_iou`) in
    FP64, compared as its kernel on that device does (its CUDA kernel with the threshold rounded to FP32): the same
    boxes kept, except where an overlap lies within a rounding of the threshold (~1e-16): torchvision's compiled CUDA
    kernel fuses the union's multiply and add into one rounding (found in its sm_90 machine code), which no
    unfused formula reproduces for every box.
    """
    rows, count = valid.shape
    keep = torch.zeros_like(valid)
    if count == 0:
        return keep
    threshold = float(torch.tensor(iou_threshold, dtype=torch.float32)) if boxes.is_cuda else iou_threshold
    before = torch.ones(count, count, dtype=torch.bool, device=boxes.device).triu_(1)  # [j, i]: j ahead of i
    group = max(1, PAIRS_PER_SOLVE // (count * count))
    for start in range(0, rows, group):
        part = slice(start, start + group)
        solved = _settle(boxes[part].double(), labels[part], valid[part], threshold, before, max_iterations)
        if solved is None:
            return None
        keep[part] = solved
    return keep


def _settle(boxes: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor, threshold: float,
            before: torch.Tensor, max_iterations: int) -> torch.Tensor | None:
    rows, count = valid.shape
    # A matrix product counts each box's kept suppressors. Every term is 0 or 1, so no rounding of the sum (FP16 on
    # CUDA, whatever its accumulation; FP32 elsewhere) turns a count above zero into zero or the reverse.
    dtype = torch.float16 if boxes.is_cuda else torch.float32
    suppressors = torch.empty(rows, count, count, dtype=dtype, device=boxes.device)  # [b, j, i]: j suppresses i
    step = max(1, PAIRS_AT_ONCE // (count * count))
    for start in range(0, rows, step):
        part = slice(start, start + step)
        suppresses = (box_iou(boxes[part], boxes[part]) > threshold) & before
        suppresses &= labels[part, :, None] == labels[part, None, :]
        suppresses &= valid[part, :, None]  # padding suppresses nothing
        suppressors[part] = suppresses
    keep = valid.clone()
    for _ in range(max_iterations):
        updated = valid & ~(torch.bmm(keep[:, None, :].to(dtype), suppressors)[:, 0] > 0)
        if torch.equal(updated, keep):
            return keep
        keep = updated
    return None


def best_first_by_image(image: torch.Tensor, scores: torch.Tensor,
                        counts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidates in runs of one image each (``image``, ``counts``) ordered image-major, best first within an image,
    equal scores in their own order: ``(order, rank)``, each one's position within its image beside it. Two stable
    sorts, by score and then by image (one by a key such as image x 2 - score lost scores under ~1e-15 to rounding)."""
    starts = torch.tensor([0, *itertools.accumulate(counts)][:-1], device=scores.device)
    order = torch.sort(scores, descending=True, stable=True).indices
    order = order[torch.sort(image[order], stable=True).indices]
    return order, torch.arange(len(order), device=scores.device) - starts[image[order]]


def _first_pass_then_rest(boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, image: torch.Tensor,
                          counts: list[int], num_classes: int, config: NMSConfig) -> list[dict[str, torch.Tensor]]:
    """:func:`_in_chunks` over each image's best :func:`first_pass_size` candidates, then again over all of them
    for each image the first pass did not settle (:func:`settled`): one host read more than a single pass (which
    images settled), and a second pass's reads where one did not."""
    first, device = first_pass_size(config), scores.device
    starts = [0, *itertools.accumulate(counts)][:-1]
    order, rank = best_first_by_image(image, scores, counts)
    chosen = order[rank < first].sort().values  # in their own order, as in _kept
    results = _in_chunks(boxes[chosen], scores[chosen], labels[chosen], image[chosen],
                         [min(count, first) for count in counts], num_classes, config)
    crowded = [index for index, count in enumerate(counts) if count > first]
    lowest = scores[order[torch.tensor([starts[index] + first - 1 for index in crowded], device=device)]]
    full = [len(results[index]["scores"]) == config.max_detections for index in crowded]
    last = torch.stack([results[index]["scores"][-1] if whole else lowest[row]  # not full: never settled
                        for row, (index, whole) in enumerate(zip(crowded, full))])
    again = [index for index, whole, above in zip(crowded, full, (last > lowest).tolist()) if not (whole and above)]
    if again:  # every candidate of those images, renumbered 0 .. len(again) - 1
        runs = torch.cat([torch.arange(starts[index], starts[index] + counts[index], device=device)
                          for index in again])
        again_counts = [counts[index] for index in again]
        renumbered = torch.repeat_interleave(torch.arange(len(again), device=device),
                                             torch.tensor(again_counts, device=device), output_size=len(runs))
        for index, result in zip(again, _in_chunks(boxes[runs], scores[runs], labels[runs], renumbered,
                                                   again_counts, num_classes, config)):
            results[index] = result
    return results


def _one_call(boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, image: torch.Tensor, chunk: range,
              num_classes: int, config: NMSConfig) -> list[dict[str, torch.Tensor]]:
    """One ``batched_nms`` over the candidates of the images in ``chunk``; -> each image's kept ones, best first."""
    groups = image * num_classes + nms_groups(labels, config)
    keep = grouped_nms(boxes, scores, groups, config.iou_threshold)  # by score, descending
    kept_image = image[keep]
    # A stable sort by image keeps each image's kept boxes in score order: keep[kept_image == i] for every i at once.
    keep = keep[torch.sort(kept_image, stable=True).indices]
    kept_counts = torch.bincount(kept_image - chunk.start, minlength=len(chunk)).tolist()
    mine = [indices[: config.max_detections] for indices in keep.split(kept_counts)]
    selected = torch.cat(mine) if mine else keep
    sizes = [len(indices) for indices in mine]
    parts = (boxes[selected].split(sizes), scores[selected].split(sizes), labels[selected].split(sizes))
    return [{"boxes": b, "scores": s, "labels": c} for b, s, c in zip(*parts)]


def postprocess(
    outputs: list[torch.Tensor], *, strides: tuple[int, ...], reg_max: int, config: NMSConfig = NMSConfig()
) -> list[dict[str, torch.Tensor]]:
    """Raw head maps -> detections in input-image pixels (undo any letterbox separately)."""
    return non_max_suppression(decode_outputs(outputs, strides, reg_max), config)


def detections_to_host(
    detections: list[dict[str, torch.Tensor]],
    map_boxes: Callable[[torch.Tensor, list[int]], torch.Tensor] | None = None,
) -> list[dict[str, torch.Tensor]]:
    """Per-image detections on the CPU, with one device-to-host copy for the whole batch.

    On CUDA each ``.cpu()`` waits for the device: three per image made ~100 waits at batch 32. Here the batch's
    boxes, scores and labels are packed into one FP32 tensor on their device (labels are class indices, exact in
    FP32 below 2**24) and copied once. ``map_boxes(boxes [N, 4], counts)`` may change every box row of the batch at
    once on the host (the letterbox undone, for one). Each image gets its own tensors, not views that keep the whole
    batch alive, in its fields' order; boxes come back in FP32 (FP16 pixel coordinates are 0.5 px apart past 1024),
    the other fields in their own dtypes.
    """
    if not detections:
        return []
    counts = [len(detection["boxes"].reshape(-1, 4)) for detection in detections]
    packed_fields = [name for name in ("boxes", "scores", "labels") if name in detections[0]]
    columns = [torch.cat([detection[name].detach().reshape(count, 4 if name == "boxes" else 1).float()
                          for detection, count in zip(detections, counts)]) for name in packed_fields]
    packed = torch.cat(columns, 1).cpu()
    boxes = map_boxes(packed[:, :4], counts) if map_boxes is not None else packed[:, :4]
    column_of = {name: 4 + index for index, name in enumerate(packed_fields[1:])}  # scores, labels after the box
    results = []
    for detection, rows, box in zip(detections, packed.split(counts), boxes.split(counts)):
        result = {}
        for key, value in detection.items():  # in the caller's order, each field back in its own dtype
            if key == "boxes":
                result[key] = box.clone()
            elif key in column_of:
                result[key] = rows[:, column_of[key]].to(value.dtype, copy=True)
            else:
                result[key] = value.cpu()
        results.append(result)
    return results
