"""Raw head maps -> final detections: DFL decode, confidence filter, class-aware NMS."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torchvision.ops import batched_nms

from detector.boxes import dfl_expectation, distances_to_boxes, flatten_head_outputs, make_anchors


def decode_outputs(outputs: list[torch.Tensor], strides: tuple[int, ...], reg_max: int) -> torch.Tensor:
    """Raw maps -> ``[B, A, 4 + C]``: xyxy boxes in input pixels, then per-class sigmoid scores."""
    flat = flatten_head_outputs(outputs).float()
    points, stride = make_anchors([o.shape[2:] for o in outputs], strides, device=flat.device, dtype=flat.dtype)
    distances = dfl_expectation(flat[..., : 4 * reg_max], reg_max)
    boxes = distances_to_boxes(points, distances) * stride
    return torch.cat((boxes, flat[..., 4 * reg_max :].sigmoid()), -1)


@dataclass(frozen=True)
class NMSConfig:
    conf_threshold: float = 0.25  # drop candidates below this class score
    iou_threshold: float = 0.7  # suppress same-class boxes overlapping more than this
    max_detections: int = 300  # keep at most this many per image
    max_candidates: int = 30000  # cap on boxes that enter NMS (bounds worst-case time)
    multi_label: bool = False  # one candidate per (box, class) above threshold, as COCO eval expects


def non_max_suppression(decoded: torch.Tensor, config: NMSConfig = NMSConfig()) -> list[dict[str, torch.Tensor]]:
    """``[B, A, 4 + C]`` decoded predictions -> per image ``{boxes [N,4] xyxy px, scores [N], labels [N]}``.

    The whole batch goes through one ``batched_nms`` call, grouped by (image, class), instead of a Python loop
    of one call per image: one candidate selection, one NMS and one split, with no per-image host syncs on a
    GPU. Per image the result equals NMS run on that image alone (each (image, class) group is suppressed on
    its own), in descending score order; only exact score ties may order differently, as in any sort.
    """
    boxes, class_scores = decoded[..., :4], decoded[..., 4:]
    num_images, num_classes = class_scores.shape[0], class_scores.shape[2]
    if config.multi_label:
        image_idx, anchor_idx, labels = (class_scores > config.conf_threshold).nonzero(as_tuple=True)
        scores = class_scores[image_idx, anchor_idx, labels]
    else:
        best_scores, best_labels = class_scores.max(2)
        image_idx, anchor_idx = (best_scores > config.conf_threshold).nonzero(as_tuple=True)
        scores, labels = best_scores[image_idx, anchor_idx], best_labels[image_idx, anchor_idx]
    # Candidates ordered by image, then by descending score: the first k of each image are its top-k.
    order = scores.argsort(descending=True)
    order = order[image_idx[order].argsort(stable=True)]
    # Top-k before NMS, as Ultralytics' max_nms=30000: bounds NMS's worst case (it grows with the square of the
    # candidates). It changes results only for an image with more than max_candidates boxes above conf.
    keep = order[_rank_within_group(image_idx[order]) < config.max_candidates]
    kept = batched_nms(boxes[image_idx[keep], anchor_idx[keep]], scores[keep],
                       image_idx[keep] * num_classes + labels[keep], config.iou_threshold)
    keep = keep[kept]  # descending score over the batch
    keep = keep[image_idx[keep].argsort(stable=True)]  # by image, still descending score within each
    keep = keep[_rank_within_group(image_idx[keep]) < config.max_detections]
    counts = torch.bincount(image_idx[keep], minlength=num_images).tolist()
    return [
        {"boxes": boxes[image_idx[part], anchor_idx[part]], "scores": scores[part], "labels": labels[part]}
        for part in keep.split(counts)
    ]


def _rank_within_group(groups: torch.Tensor) -> torch.Tensor:
    """``[N]`` sorted group ids -> each element's position within its run of equal ids (0, 1, ... per group)."""
    positions = torch.arange(len(groups), device=groups.device)
    is_start = torch.ones_like(groups, dtype=torch.bool)
    is_start[1:] = groups[1:] != groups[:-1]
    starts = torch.where(is_start, positions, torch.zeros_like(positions)).cummax(0).values
    return positions - starts


def postprocess(
    outputs: list[torch.Tensor], *, strides: tuple[int, ...], reg_max: int, config: NMSConfig = NMSConfig()
) -> list[dict[str, torch.Tensor]]:
    """Raw head maps -> detections in input-image pixels (undo any letterbox separately)."""
    return non_max_suppression(decode_outputs(outputs, strides, reg_max), config)
