"""Task-aligned assigner (TOOD): which anchors learn which ground-truth box, and how strongly.

Pure: tensors in, targets out. An anchor is a candidate for a box when its centre lies inside the box;
among candidates, the ``top_k`` with the highest alignment ``score**alpha * iou**beta`` become positives.
An anchor claimed by several boxes keeps the one it overlaps most. ``iou`` is the complete IoU (CIoU, clamped at 0)
of the box and the anchor's predicted box, as in Ultralytics' assigner: tests/test_loss_oracle.py compares the two.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from detector.boxes import complete_iou_pairs, xyxy_to_cxcywh

EPS = 1e-9


@dataclass(frozen=True)
class AssignerConfig:
    """``top_k`` candidate anchors per box; the alignment metric is ``score ** alpha * iou ** beta`` (TOOD);
    ``min_side``: a box side shorter than this (pixels) is widened to it about its centre to find the box's candidate
    anchors, as Ultralytics does with its second stride (16 for strides 8/16/32), so that a box narrower than a
    stride still holds anchor centres: without it, a box between two rows of centres had no candidate and trained
    nothing."""

    top_k: int = 10
    alpha: float = 0.5
    beta: float = 6.0
    min_side: float = 16.0
    # Then, of each box's positives, only its ``top_k_after`` best by alignment stay (None: all): 1 gives each box one
    # anchor, which YOLO26's one-to-one branch learns (Ultralytics' ``topk2``).
    top_k_after: int | None = None


@dataclass
class AssignedTargets:
    labels: torch.Tensor  # [B, A] long, class of the matched box (0 where background)
    boxes: torch.Tensor  # [B, A, 4] xyxy pixels of the matched box
    scores: torch.Tensor  # [B, A, C] soft one-hot targets scaled by normalised alignment
    foreground: torch.Tensor  # [B, A] bool


def empty_targets(class_logits: torch.Tensor) -> AssignedTargets:
    """All background: what a batch without ground-truth boxes assigns."""
    batch, anchors, classes = class_logits.shape
    device = class_logits.device
    return AssignedTargets(
        labels=torch.zeros(batch, anchors, dtype=torch.long, device=device),
        boxes=torch.zeros(batch, anchors, 4, device=device),
        scores=torch.zeros(batch, anchors, classes, device=device),
        foreground=torch.zeros(batch, anchors, dtype=torch.bool, device=device),
    )


def candidate_anchors(
    anchor_points: torch.Tensor, gt_boxes: torch.Tensor, gt_mask: torch.Tensor, min_side: float = 0.0
) -> torch.Tensor:
    """``[B, M, A]`` bool: the anchor centre ``[A, 2]`` lies strictly inside a real (unpadded) box ``[B, M, 4]``,
    its sides shorter than ``min_side`` widened to it about its centre (:class:`AssignerConfig`).

    Four bool comparisons ANDed, the same answer as ``min(four distances) > EPS`` without the float
    ``[B, M, A, 4]`` stack of distances it took (at 640 px, batch 64 and 256 box slots: 2.2 GB).
    """
    x, y = anchor_points[:, 0], anchor_points[:, 1]
    # Every box goes through centre and size and back, widened or not, as Ultralytics' does: the same corners to
    # the last bit, so an anchor centre on a corner's rounding is a candidate on both sides or on neither.
    centre, size = xyxy_to_cxcywh(gt_boxes).split(2, -1)
    size = size.clamp(min=min_side)
    half = size / 2
    gx1, gy1, gx2, gy2 = (corner[..., None] for corner in torch.cat((centre - half, centre + half), -1).unbind(-1))
    inside = (x - gx1 > EPS) & (y - gy1 > EPS)
    inside &= gx2 - x > EPS
    inside &= gy2 - y > EPS
    return inside & gt_mask[..., None]


def alignment_metric(
    class_logits: torch.Tensor, pred_boxes: torch.Tensor, gt_labels: torch.Tensor, gt_boxes: torch.Tensor,
    candidates: torch.Tensor, *, alpha: float, beta: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (alignment ``score**alpha * iou**beta``, IoU), both ``[B, M, A]`` and zero outside ``candidates``;
    ``score`` is the sigmoid of each box's class logit (``class_logits`` ``[B, A, C]``), ``iou`` the complete IoU
    clamped at 0 (Ultralytics' overlap; plain IoU, used here before, picked other anchors and larger class targets:
    the cls loss 12-24% below Ultralytics' on random scenes)."""
    anchors = class_logits.shape[1]
    iou = complete_iou_pairs(gt_boxes, pred_boxes).clamp_(0) * candidates  # [B, M, A], the whole batch at once
    # The sigmoid of the gathered logits only (each box's class; an elementwise function, so the values of gathering
    # from the sigmoid of all of them, up to the last bit where a CPU's vectorised loop ends): no [B, A, C]
    # probabilities, 172 MB for COCO at batch 64 and 640 px, beside the logits and the class targets at the loss's
    # peak memory.
    class_score = class_logits.gather(2, gt_labels[:, None, :].expand(-1, anchors, -1)).transpose(1, 2).sigmoid_()
    # In place on the gathered scores (a tensor of this call's own): the same products in the same order, with two
    # [B, M, A] temporaries fewer at the loss's peak memory (69 MB each at batch 64, 640 px and 32 box slots).
    return class_score.pow_(alpha).mul_(iou.pow(beta)).mul_(candidates), iou


def select_positives(
    alignment: torch.Tensor, iou: torch.Tensor, candidates: torch.Tensor, *, top_k: int,
    top_k_after: int | None = None,
) -> torch.Tensor:
    """``[B, M, A]`` bool: each box's ``top_k`` candidates by alignment; an anchor claimed by several boxes
    keeps the box it overlaps most, so every anchor ends with at most one box. ``top_k_after``: then each box keeps
    only that many of its positives, the best aligned (:class:`AssignerConfig`)."""
    k = min(top_k, alignment.shape[-1])
    top_idx = alignment.topk(k, dim=-1).indices
    in_top_k = torch.zeros_like(candidates).scatter_(-1, top_idx, True)
    positive = in_top_k & candidates
    multi = positive.sum(1, keepdim=True) > 1
    # max(dim).indices, not argmax(dim): same first-maximum rule, ~5x faster over a non-innermost dim on CPU.
    best_gt = iou.max(1, keepdim=True).indices
    best_onehot = torch.zeros_like(positive).scatter_(1, best_gt, True)
    positive = torch.where(multi, best_onehot, positive) & candidates
    if top_k_after is not None and top_k_after < k:
        # As Ultralytics' topk2: the best of what is left. A box whose positives all align at 0 (a score or overlap
        # that underflowed) may then keep none, as there.
        kept = (alignment * positive).topk(min(top_k_after, alignment.shape[-1]), dim=-1).indices
        positive &= torch.zeros_like(positive).scatter_(-1, kept, True)
    return positive


def gather_matched(
    positive: torch.Tensor, gt_labels: torch.Tensor, gt_boxes: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> per anchor: foreground ``[B, A]`` bool, class ``[B, A]`` and xyxy box ``[B, A, 4]`` of its box."""
    foreground = positive.any(1)
    gt_index = positive.to(torch.uint8).max(1).indices  # [B, A]; at most one True per anchor by now
    labels = gt_labels.gather(1, gt_index)
    boxes = gt_boxes.gather(1, gt_index[..., None].expand(-1, -1, 4))
    return foreground, labels, boxes


def soft_class_targets(
    alignment: torch.Tensor, iou: torch.Tensor, positive: torch.Tensor, labels: torch.Tensor,
    foreground: torch.Tensor, num_classes: int,
) -> torch.Tensor:
    """``[B, A, C]`` one-hot targets scaled so each box's best anchor gets that box's best IoU."""
    alignment = alignment * positive
    max_alignment = alignment.amax(-1, keepdim=True)
    max_iou = (iou * positive).amax(-1, keepdim=True)
    # In place on this function's own product: the same operations in the same order, two [B, M, A] temporaries
    # fewer where the loss peaks in memory.
    norm = alignment.mul_(max_iou).div_(max_alignment + EPS).amax(1)  # [B, A]
    # one_hot checks the label range on the host for CPU tensors; a scatter gives the same 0/1 floats everywhere.
    scores = torch.zeros(*labels.shape, num_classes, device=labels.device).scatter_(-1, labels[..., None], 1.0)
    return scores.mul_((foreground * norm)[..., None])  # in place: no second [B, A, C] tensor (172 MB for COCO)


@torch.no_grad()
def assign_targets(
    class_logits: torch.Tensor,
    pred_boxes: torch.Tensor,
    anchor_points: torch.Tensor,
    gt_labels: torch.Tensor,
    gt_boxes: torch.Tensor,
    gt_mask: torch.Tensor,
    *,
    num_classes: int,
    config: AssignerConfig = AssignerConfig(),
) -> AssignedTargets:
    """Assign ground truth to anchors.

    Args:
        class_logits: ``[B, A, C]`` class logits (before the sigmoid, which is taken of each box's class only).
        pred_boxes: ``[B, A, 4]`` predicted xyxy boxes, pixels.
        anchor_points: ``[A, 2]`` anchor centres, pixels.
        gt_labels: ``[B, M]`` class ids (padded).
        gt_boxes: ``[B, M, 4]`` xyxy pixels (padded).
        gt_mask: ``[B, M]`` bool, True for real (non-padding) boxes.
        config: candidates per box and the alignment exponents (:class:`AssignerConfig`).
    """
    if gt_boxes.shape[1] == 0:
        return empty_targets(class_logits)
    class_logits, pred_boxes, gt_boxes = class_logits.float(), pred_boxes.float(), gt_boxes.float()
    gt_labels = gt_labels.long().clamp(0, num_classes - 1)
    candidates = candidate_anchors(anchor_points, gt_boxes, gt_mask, config.min_side)
    alignment, iou = alignment_metric(class_logits, pred_boxes, gt_labels, gt_boxes, candidates, alpha=config.alpha,
                                       beta=config.beta)
    positive = select_positives(alignment, iou, candidates, top_k=config.top_k, top_k_after=config.top_k_after)
    foreground, labels, boxes = gather_matched(positive, gt_labels, gt_boxes)
    scores = soft_class_targets(alignment, iou, positive, labels, foreground, num_classes)
    return AssignedTargets(labels=labels, boxes=boxes, scores=scores, foreground=foreground)
