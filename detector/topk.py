"""The NMS-free postprocess of an end-to-end head (YOLO26's one-to-one branch): per image, the best (box, class) pairs
by score, no suppression.

The one-to-one branch is trained to score one anchor per object (detector/loss.py), so its duplicates score low and
no NMS is needed: the answer is the top ``max_detections`` pairs above the threshold, as Ultralytics' ``nms=False``
gives (``Detect.postprocess``: a top-k of anchors by their best class score, then a top-k of their pairs, which is
the top-k of all pairs, and the end-to-end branch of ``utils/nms.py``: those above ``conf``). Multi-label by nature:
one anchor may give several classes. ``agnostic``: each anchor's best class alone. At most
``min(max_detections, anchors)`` pairs, Ultralytics' ``k``.

Equal scores are ordered by the pair's index (anchor x classes + class, the order of the decoded outputs), lowest
first, and the last places go to the first of them: the same pairs on every device, batched or per image (an
ONNX ``TopK`` breaks ties the same way, so the in-graph form of :func:`detector.exporting.wrapper.pack_top_k` agrees).
"""

from __future__ import annotations

import itertools

import torch


def top_k_detections(decoded: torch.Tensor, *, conf_threshold: float, max_detections: int,
                     agnostic: bool = False) -> list[dict[str, torch.Tensor]]:
    """``[B, A, 4 + C]`` decoded predictions (xyxy px, then class scores) -> per image ``{boxes [N, 4], scores [N],
    labels [N]}``, best first, N <= ``min(max_detections, A)``: the pairs scored above ``conf_threshold`` (a box with
    a NaN or infinite coordinate never is one, as in :func:`detector.postprocess.above_conf`).

    The whole batch at once, in a handful of tensor operations and two host reads (the candidates, and how many
    each image has), on the CPU as on CUDA: a ``topk`` finds each image's k-th best score, every pair at least as
    good (ties included) is a candidate, and two stable sorts order them by image, then score, then index.
    """
    boxes, class_scores = decoded[..., :4], decoded[..., 4:]
    batch, anchors, classes = class_scores.shape
    if agnostic:
        scores, best_labels = class_scores.max(-1)  # [B, A]: the first of equal maxima (torch's promise)
    else:
        scores = class_scores.reshape(batch, anchors * classes)  # pair index = anchor x classes + class
    per_anchor = scores.shape[1] // max(anchors, 1)
    finite = boxes.isfinite().all(-1).repeat_interleave(per_anchor, 1)
    valid = (scores > conf_threshold) & finite  # NaN scores compare False
    k = min(max_detections, anchors)
    if k == 0 or batch == 0:
        return [_empty(decoded) for _ in range(batch)]
    masked = torch.where(valid, scores, torch.full_like(scores, -1.0))  # below every sigmoid score
    kth = masked.topk(k, dim=1).values[:, -1:]  # each image's k-th best (-1 where fewer are valid)
    image, pair = (valid & (masked >= kth)).nonzero(as_tuple=True)  # image-major, index ascending
    pair_scores = masked[image, pair]
    order = torch.sort(pair_scores, descending=True, stable=True).indices  # equal scores keep index order
    order = order[torch.sort(image[order], stable=True).indices]  # then by image, each image's best first
    counts = torch.bincount(image, minlength=batch).tolist()  # ties at the k-th may make more than k
    starts = torch.tensor([0, *itertools.accumulate(counts)][:-1], device=decoded.device)
    rank = torch.arange(len(order), device=decoded.device) - starts[image[order]]
    kept = order[rank < k]
    image, pair = image[kept], pair[kept]
    anchor = pair if agnostic else torch.div(pair, classes, rounding_mode="floor")
    labels = best_labels[image, anchor] if agnostic else pair % classes
    sizes = [min(count, k) for count in counts]
    parts = (boxes[image, anchor].split(sizes), scores[image, pair].split(sizes), labels.split(sizes))
    return [{"boxes": b, "scores": s, "labels": c} for b, s, c in zip(*parts)]


def _empty(decoded: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"boxes": decoded.new_zeros((0, 4)), "scores": decoded.new_zeros((0,)),
            "labels": torch.zeros(0, dtype=torch.int64, device=decoded.device)}
