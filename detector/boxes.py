"""Box geometry shared by the loss, the assigner, the postprocess and the metrics.

Conventions: ``xyxy`` is (x1, y1, x2, y2), ``cxcywh`` is (centre x, centre y, width, height).
Distances ``ltrb`` are from an anchor point to the left, top, right and bottom box sides.
Units are whatever the caller passes (grid cells or pixels); nothing here rescales.
"""

from __future__ import annotations

import math

import torch


def make_anchors(
    feature_shapes: list[tuple[int, int]], strides: tuple[int, ...], *, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Anchor centres for every cell of every level.

    Returns:
        points ``[A, 2]`` (x, y) in grid units of their own level (cell centre, +0.5),
        strides ``[A, 1]`` so that ``points * strides`` are pixel positions.
    """
    points, stride_list = [], []
    for (height, width), stride in zip(feature_shapes, strides):
        ys = torch.arange(height, device=device, dtype=dtype) + 0.5
        xs = torch.arange(width, device=device, dtype=dtype) + 0.5
        grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
        points.append(torch.stack((grid_x, grid_y), -1).view(-1, 2))
        stride_list.append(torch.full((height * width, 1), stride, device=device, dtype=dtype))
    return torch.cat(points), torch.cat(stride_list)


def distances_to_boxes(points: torch.Tensor, ltrb: torch.Tensor) -> torch.Tensor:
    """Anchor points ``[..., 2]`` and distances ``[..., 4]`` -> xyxy boxes ``[..., 4]``."""
    left_top, right_bottom = ltrb.chunk(2, -1)
    return torch.cat((points - left_top, points + right_bottom), -1)


def boxes_to_distances(points: torch.Tensor, boxes: torch.Tensor, max_distance: float) -> torch.Tensor:
    """Inverse of :func:`distances_to_boxes`, clamped to ``[0, max_distance]`` (the DFL bin range)."""
    x1y1, x2y2 = boxes.chunk(2, -1)
    return torch.cat((points - x1y1, x2y2 - points), -1).clamp_(0, max_distance)


def xyxy_to_cxcywh(boxes: torch.Tensor) -> torch.Tensor:
    x1, y1, x2, y2 = boxes.unbind(-1)
    return torch.stack(((x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1), -1)


def cxcywh_to_xyxy(boxes: torch.Tensor) -> torch.Tensor:
    cx, cy, w, h = boxes.unbind(-1)
    return torch.stack((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2), -1)


def box_iou(boxes1: torch.Tensor, boxes2: torch.Tensor, eps: float = 0.0) -> torch.Tensor:
    """xyxy ``[..., N, 4]`` x ``[..., M, 4]`` -> IoU ``[..., N, M]``: torchvision's ``box_iou`` (the same operations,
    so the same values; also its NMS kernels' overlap, ``inter / (area_n + area_m - inter)``), with ``eps`` added to
    each union where asked (the assigner's boxes may be empty). One axis at a time: no ``[..., N, M, 2]``
    intermediate, whose size bounds how many pairs NMS's fixed point takes at once."""
    inter = box_intersection(boxes1, boxes2)
    area1 = (boxes1[..., 2] - boxes1[..., 0]) * (boxes1[..., 3] - boxes1[..., 1])
    area2 = (boxes2[..., 2] - boxes2[..., 0]) * (boxes2[..., 3] - boxes2[..., 1])
    union = area1[..., :, None] + area2[..., None, :] - inter
    return inter / (union + eps if eps else union)


def complete_iou_pairs(boxes1: torch.Tensor, boxes2: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """xyxy ``[..., N, 4]`` x ``[..., M, 4]`` -> complete IoU (CIoU) ``[..., N, M]``, defined as in the task-aligned
    assigner of Ultralytics' YOLOv8 (tests/test_loss_oracle.py compares them): ``eps`` added to each box's height, to
    the union and to the enclosing box's squared diagonal, and the aspect term weighted by ``v / (1 - iou + v + eps)``.
    Unclamped: it is negative where the boxes are apart. Each box's aspect angle is taken once, not once a pair, and
    the pair tensors are reused in place: the assigner holds a few ``[B, M, A]`` tensors at its peak, not nine."""
    x1, y1, x2, y2 = boxes1[..., :, None, :].unbind(-1)  # [..., N, 1] each
    x1g, y1g, x2g, y2g = boxes2[..., None, :, :].unbind(-1)  # [..., 1, M] each
    width1, height1 = x2 - x1, y2 - y1 + eps
    width2, height2 = x2g - x1g, y2g - y1g + eps
    intersection = box_intersection(boxes1, boxes2)
    iou = intersection.div_((width1 * height1 + width2 * height2).sub_(intersection).add_(eps))
    diagonal = torch.maximum(x2, x2g).sub_(torch.minimum(x1, x1g)).square_()
    diagonal.add_(torch.maximum(y2, y2g).sub_(torch.minimum(y1, y1g)).square_()).add_(eps)
    # Centre distance squared: the sums of both sides' coordinates differ by twice the centres' offset.
    distance = (x1g + x2g - x1 - x2).square_().add_((y1g + y2g - y1 - y2).square_()).div_(4).div_(diagonal)
    del diagonal
    v = (torch.atan(width2 / height2) - torch.atan(width1 / height1)).square_().mul_(4 / math.pi**2)
    alpha = v / (1 - iou).add_(v).add_(eps)
    return iou.sub_(distance.add_(alpha.mul_(v)))


def box_intersection(boxes1: torch.Tensor, boxes2: torch.Tensor) -> torch.Tensor:
    """xyxy ``[..., N, 4]`` x ``[..., M, 4]`` -> the area each pair shares ``[..., N, M]`` (:func:`box_iou`'s)."""
    first, second = boxes1[..., :, None, :], boxes2[..., None, :, :]

    def overlap(low: int, high: int) -> torch.Tensor:  # [..., N, M]: the overlap along one axis
        return (torch.minimum(first[..., high], second[..., high])
                - torch.maximum(first[..., low], second[..., low])).clamp_(min=0)

    return overlap(0, 2) * overlap(1, 3)


def flatten_head_outputs(outputs: list[torch.Tensor]) -> torch.Tensor:
    """Per-level maps ``[B, C, H_i, W_i]`` -> one contiguous tensor ``[B, A, C]`` with anchors in level order."""
    # Moving channels last is free for channels-last maps (the training layout), and a contiguous [B, A, C]
    # lets the per-anchor DFL softmax and the foreground gathers read memory in order.
    return torch.cat([o.permute(0, 2, 3, 1).flatten(1, 2) for o in outputs], 1)


def dfl_expectation(box_logits: torch.Tensor, reg_max: int) -> torch.Tensor:
    """DFL bin logits ``[..., 4*reg_max]`` -> expected distances ``[..., 4]`` in grid units. With ``reg_max`` 1
    (YOLO26) the head's values are the distances themselves."""
    if reg_max == 1:
        return box_logits
    # Three dimensions, never four: Inductor lays every 4-D tensor of a convolutional graph out channels-last,
    # which put the [B, A, 4, reg_max] softmax's anchors innermost and its exponentials into a scalar loop (the
    # compiled decode took 4.8 ms instead of 2.5; nano at 640 px, 2-core CPU). The leading dims merge into a view.
    rows = box_logits.reshape(-1, box_logits.shape[-1])
    probs = rows.reshape(-1, 4, reg_max).softmax(-1)  # not unflatten: ONNX opsets before 13 lack it
    bins = torch.arange(reg_max, device=box_logits.device, dtype=probs.dtype)
    return (probs @ bins).view(*box_logits.shape[:-1], 4)
