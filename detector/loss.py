"""The detection criterion: CIoU box loss + BCE classification + distribution focal loss (YOLOv8, YOLO11), or for
YOLO26 an L1 loss of the box distances in place of DFL, on both of its head's branches (:class:`DetectionLoss`).

Computed in FP32, outside autocast, whatever precision the forward pass used.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from detector.assigner import AssignedTargets, AssignerConfig, assign_targets
from detector.boxes import (
    boxes_to_distances,
    cxcywh_to_xyxy,
    dfl_expectation,
    distances_to_boxes,
    flatten_head_outputs,
    make_anchors,
)


@dataclass(frozen=True)
class LossGains:
    box: float = 7.5
    cls: float = 0.5
    dfl: float = 1.5


def frequency_weights(counts: torch.Tensor, power: float) -> torch.Tensor | None:
    """Per-class weights of the classification loss against class imbalance (``--cls-pw``, Ultralytics' ``cls_pw``):
    ``(1 / the class's training boxes) ** power``, a class without training boxes given the others' mean, then
    scaled to a mean of 1, so ``--cls-gain`` keeps its meaning. None where ``power`` is 0, no class has a box, or
    there is one class (its weight would be 1)."""
    present = counts > 0
    if power == 0 or not present.any() or len(counts) == 1:
        return None
    weights = torch.where(present, counts.double(), 1.0).reciprocal() ** power
    weights = torch.where(present, weights, weights[present].mean())
    return (weights / weights.mean()).float()


class PaddedTargets(NamedTuple):
    """One batch's ground truth per image: labels ``[B, M]`` long, xyxy pixel boxes ``[B, M, 4]``, and ``mask``
    ``[B, M]`` bool (True for a real box; padding rows are zero). ``M`` is the most boxes in one image, or a
    fixed slot count (:func:`box_slots`) so that a captured step sees one shape whatever the batch holds."""

    labels: torch.Tensor
    boxes: torch.Tensor
    mask: torch.Tensor


# Fixed box counts grow in powers of two from this: a handful of shapes covers any dataset (COCO's most boxes in
# one mosaic image stay under 1024), each a separate captured graph.
MIN_BOX_SLOTS = 16


def box_slots(most_boxes: int) -> int:
    """The fixed box count for a batch whose fullest image holds ``most_boxes``: the next power of two, at
    least :data:`MIN_BOX_SLOTS`. Padding rows cost assigner work (``[B, M, A]`` tensors) but change no result."""
    slots = MIN_BOX_SLOTS
    while slots < most_boxes:
        slots *= 2
    return slots


def most_boxes_per_image(targets: torch.Tensor, batch_size: int) -> int:
    """The most ground-truth boxes one image of the batch holds (targets ``[N, 6]``, image index first).

    Reads the count on the host: call it where the targets are (the loader's host memory), not on the GPU."""
    if not len(targets) or not batch_size:
        return 0
    return int(torch.bincount(targets[:, 0].long(), minlength=batch_size).max())


def targets_to_padded(
    targets: torch.Tensor, batch_size: int, image_hw: tuple[int, int], *, slots: int | None = None,
    pin: bool = False,
) -> PaddedTargets:
    """Targets ``[N, 6]`` (image index, class, cx, cy, w, h normalised) -> padded per-image tensors.

    ``slots``: the box count ``M`` to pad to (at least the most boxes in one image); None pads to exactly
    that most. Extra padding changes neither the assignment nor the gradients, and the loss only in the order of
    its sums (masked rows take no anchor: tests/test_loss.py compares them). ``pin``: made in page-locked memory
    (host targets bound for a GPU; needs CUDA): a non-blocking copy from pageable memory may make the host wait
    for the stream, and so for the step before, where the driver stages it (the larger sizes: 64 x 512 slots of
    boxes is 512 KB).
    """
    device = targets.device
    counts = torch.bincount(targets[:, 0].long(), minlength=batch_size) if len(targets) else torch.zeros(
        batch_size, dtype=torch.long, device=device
    )
    most = int(counts.max()) if batch_size else 0
    if slots is not None:
        if slots < most:
            raise ValueError(f"{slots} box slots cannot hold an image with {most} boxes")
        most = slots
    labels = torch.zeros(batch_size, most, dtype=torch.long, device=device, pin_memory=pin)
    boxes = torch.zeros(batch_size, most, 4, device=device, pin_memory=pin)
    mask = torch.zeros(batch_size, most, dtype=torch.bool, device=device, pin_memory=pin)
    if len(targets):
        image_index = targets[:, 0].long()
        order = torch.argsort(image_index, stable=True)
        image_index = image_index[order]
        starts = torch.cumsum(counts, 0) - counts
        slot = torch.arange(len(targets), device=device) - starts[image_index]
        height, width = image_hw
        scale = torch.tensor([width, height, width, height], device=device, dtype=torch.float)
        labels[image_index, slot] = targets[order, 1].long()
        boxes[image_index, slot] = cxcywh_to_xyxy(targets[order, 2:6].float() * scale)
        mask[image_index, slot] = True
    return PaddedTargets(labels, boxes, mask)


def complete_iou_loss(boxes1: torch.Tensor, boxes2: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """``[N, 4]`` x ``[N, 4]`` xyxy -> ``[N]`` CIoU loss: torchvision's ``complete_box_iou_loss`` term for term.

    Written out because torchvision fills the intersection through a boolean mask (``inter[mask] = ...``),
    which counts the mask on the host: inside a CUDA graph capture that read fails the capture. Here the
    same product is kept with ``torch.where``: the same values and, outside the mask, the same zero gradient.
    """
    # Half precision upcast as torchvision does (its products can overflow FP16); float64 stays.
    boxes1, boxes2 = (b if b.dtype in (torch.float32, torch.float64) else b.float() for b in (boxes1, boxes2))
    x1, y1, x2, y2 = boxes1.unbind(-1)
    x1g, y1g, x2g, y2g = boxes2.unbind(-1)
    left, top, right, bottom = torch.max(x1, x1g), torch.max(y1, y1g), torch.min(x2, x2g), torch.min(y2, y2g)
    overlap = (bottom > top) & (right > left)
    intersection = torch.where(overlap, (right - left) * (bottom - top), torch.zeros_like(x1))
    union = (x2 - x1) * (y2 - y1) + (x2g - x1g) * (y2g - y1g) - intersection
    iou = intersection / (union + eps)
    # Distance term: centre distance over the diagonal of the smallest enclosing box, both squared.
    diagonal = ((torch.max(x2, x2g) - torch.min(x1, x1g)) ** 2) + ((torch.max(y2, y2g) - torch.min(y1, y1g)) ** 2) + eps
    centres = (((x2 + x1) / 2 - (x1g + x2g) / 2) ** 2) + (((y2 + y1) / 2 - (y1g + y2g) / 2) ** 2)
    distance_loss = 1 - iou + centres / diagonal
    # Aspect-ratio term, its weight alpha held out of the gradient (as in the paper and torchvision).
    v = (4 / (torch.pi**2)) * torch.pow(torch.atan((x2g - x1g) / (y2g - y1g)) - torch.atan((x2 - x1) / (y2 - y1)), 2)
    with torch.no_grad():
        alpha = v / (1 - iou + v + eps)
    return distance_loss + alpha * v


def distribution_focal_loss(bin_logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``[N, 4, reg_max]`` logits, ``[N, 4]`` continuous targets in bin units -> ``[N]`` loss.

    Cross-entropy against the two bins either side of the target, weighted by proximity.
    """
    left = target.long()
    right = left + 1
    weight_left = right - target
    weight_right = 1 - weight_left
    logits = bin_logits.flatten(0, 1)
    loss = F.cross_entropy(logits, left.flatten(), reduction="none") * weight_left.flatten()
    loss = loss + F.cross_entropy(logits, right.flatten(), reduction="none") * weight_right.flatten()
    return loss.view(target.shape).mean(-1)


# A valid box (grid units) put in place of the boxes of every padding anchor (below): CIoU of two equal unit boxes
# is finite, so their zero weight cannot turn into 0 * NaN in the loss or its gradient.
_SAFE_BOX = (0.0, 0.0, 1.0, 1.0)


def foreground_slots(anchors: int, box_slots: int, top_k: int) -> int:
    """The anchors per image that hold every foreground anchor. Each of the assigner's foreground anchors is among
    the ``top_k`` candidates of at least one of the ``box_slots`` boxes (an anchor several boxes picked then goes to
    the one it overlaps most, which may not have picked it: detector/assigner.py), so an image has at most
    ``top_k * box_slots`` (and never more than there are anchors; at least 1, so an empty batch keeps a graph).
    Crowded images (840 box slots and more at 640 px with top_k 10) take every anchor. Where each box then keeps
    only its best positives (the one-to-one branch's ``top_k_after``), that count bounds it in place of ``top_k``."""
    return max(1, min(anchors, top_k * box_slots))


def foreground_losses(
    box_logits: torch.Tensor,
    target_boxes: torch.Tensor,
    points: torch.Tensor,
    weights: torch.Tensor,
    foreground: torch.Tensor,
    *,
    reg_max: int,
    slots: int,
    side_scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted sums of the CIoU and DFL losses over the foreground anchors; with ``reg_max`` 1 (YOLO26's direct
    distances) the second is an L1 loss of the four distances, each as a share of the image's width or height
    (``side_scale`` ``[A, 4]``: each anchor's stride over the input's width, height, width, height), as Ultralytics'.

    ``box_logits`` ``[B, A, 4 * reg_max]`` (any float dtype; computed in FP32), ``target_boxes`` ``[B, A, 4]`` xyxy
    grid units, ``points`` ``[A, 2]``, ``weights`` and ``foreground`` ``[B, A]``; ``slots``
    (:func:`foreground_slots`): at least the most foreground anchors of one image.

    Computed on ``slots`` anchors per image, every foreground one and, to fill them, background ones at zero
    weight: a fixed shape, so the step never waits to count the foreground on the host (a captured CUDA graph
    cannot), and far less than every anchor (8,400 at 640 px; as this once did on CUDA), whose three softmaxes over
    ``[B, A, 4, reg_max]`` were kept for the backward pass (~0.4 GB at batch 64, 640 px; the anchors' other
    boxes, which the assigner reads, are decoded without gradient). The sums are those over the foreground alone up
    to the order of the additions.
    """
    # The top ``slots`` of a 0/1 mask: every foreground anchor, then background ones. topk, which the assigner
    # already runs inside the captured step, rather than a sort: no kernel the capture has not taken before.
    index = foreground.to(torch.float32).topk(slots, dim=1, sorted=False).indices
    chosen = foreground.gather(1, index)  # [B, K]; False: padding
    weight = (weights.gather(1, index) * chosen).flatten()
    # index_select on the anchors of all images as one axis (a view, even of the head's split outputs): its backward
    # keeps only the index and adds into zeros (index_add_, one kernel), where gather keeps its whole input (every
    # anchor's logits) and indexing's backward sorts its indices first.
    batch, anchors = foreground.shape
    rows = (index + torch.arange(batch, device=index.device)[:, None] * anchors).flatten()
    logits = box_logits.flatten(0, 1).index_select(0, rows).view(batch, -1, box_logits.shape[-1]).float()
    anchor = points[index]  # [B, K, 2]
    # Made by a kernel on the device, not copied from the host: a blocking copy waits for the stream, and no host
    # copy may sit inside a captured CUDA graph.
    safe = (torch.arange(4, device=points.device) >= 2).to(points.dtype)  # = _SAFE_BOX
    mask = chosen[..., None]
    distances = dfl_expectation(logits, reg_max)
    pred = torch.where(mask, distances_to_boxes(anchor, distances), safe)
    target = torch.where(mask, target_boxes.gather(1, index[..., None].expand(-1, -1, 4)), safe)
    box_sum = (complete_iou_loss(pred.flatten(0, 1), target.flatten(0, 1)) * weight).sum()
    if reg_max == 1:
        if side_scale is None:
            raise ValueError("direct distances (reg_max 1) need side_scale")
        # Unclamped (no bin range); padding rows zeroed before the weight, so a diverging logit there adds no NaN.
        target_dist = torch.cat((anchor - target[..., :2], target[..., 2:] - anchor), -1)
        error = torch.where(mask, (distances - target_dist) * side_scale[index], 0.0)
        return box_sum, (error.abs().mean(-1).flatten() * weight).sum()
    target_dist = boxes_to_distances(anchor, target, reg_max - 1 - 0.01).flatten(0, 1)
    dfl_sum = (distribution_focal_loss(logits.reshape(-1, 4, reg_max), target_dist) * weight).sum()
    return box_sum, dfl_sum


# The most elements one of the assigner's [images, box slots, anchors] tensors holds (32 MB in FP32): at batch 64,
# 640 px and 32 box slots (17.2M elements) the batch goes in three chunks, on a CPU's usual batch 16 in one.
ASSIGNER_CHUNK_ELEMENTS = 2**23


def assignment_chunks(batch: int, box_slots: int, anchors: int) -> list[slice]:
    """Slices of the batch in order, their sizes at most one apart, each under :data:`ASSIGNER_CHUNK_ELEMENTS` per
    ``[images, box_slots, anchors]`` tensor (one image a chunk at least; one empty slice for an empty batch): what
    :meth:`DetectionLoss.assign` takes at a time."""
    most = max(1, ASSIGNER_CHUNK_ELEMENTS // max(1, box_slots * anchors))  # images a chunk may hold
    count = max(1, -(-batch // most))
    sizes = [batch // count + (index < batch % count) for index in range(count)]  # even: each at most `most`
    starts = [sum(sizes[:index]) for index in range(count)]
    return [slice(start, start + size) for start, size in zip(starts, sizes)]


Assignment = AssignedTargets | tuple[AssignedTargets, AssignedTargets]  # one per head branch where there are two

# YOLO26's two branches (Ultralytics' E2ELoss): the usual one assigns each box its top 10 anchors, the one-to-one
# branch its best of 7. The usual branch's share of the loss falls linearly over the run from 0.8 to 0.1.
ONE_TO_ONE_TOP_K = (7, 1)
ONE_TO_MANY_WEIGHTS = (0.8, 0.1)


def one_to_many_weight(epoch: int, epochs: int) -> float:
    """The usual branch's weight in an end-to-end head's loss in ``epoch`` (from 0) of ``epochs``: 0.8 in the first
    epoch, 0.1 in the last, linear between (Ultralytics' decay, its ``updates`` being the epochs done); the
    one-to-one branch has the rest."""
    first, last = ONE_TO_MANY_WEIGHTS
    return max(1 - epoch / max(epochs - 1, 1), 0.0) * (first - last) + last


class DetectionLoss(torch.nn.Module):
    """Callable criterion: ``loss(outputs, targets, image_hw) -> (total, {box, cls, dfl})``.

    ``total`` is the gain-weighted sum multiplied by the (global) batch size, so the gradient scale does
    not depend on batch size once the optimizer's nominal-batch accumulation is taken into account.
    Under torch.distributed each rank returns its share: the parts of all ranks sum to the global loss.

    ``end_to_end`` (YOLO26): in training ``outputs`` holds both branches' maps (detector/model/head.py), each branch
    is assigned and scored by itself (the one-to-one branch with :data:`ONE_TO_ONE_TOP_K`), and ``total`` is their
    weighted sum (:meth:`set_epoch`). The parts returned are the usual branch's, the one evaluation decodes, so that
    the ``train/*`` and ``val/*`` columns of results.csv measure one branch (a validation pass has its maps alone:
    given one branch's maps, the loss is that branch's). Ultralytics logs the one-to-one branch's in training. With
    ``reg_max`` 1 the ``dfl`` part is the L1 loss of the distances (:func:`foreground_losses`), under the same gain.
    """

    def __init__(
        self,
        *,
        num_classes: int,
        strides: tuple[int, ...],
        reg_max: int = 16,
        gains: LossGains = LossGains(),
        assigner: AssignerConfig = AssignerConfig(),
        class_weights: torch.Tensor | None = None,
        end_to_end: bool = False,
    ) -> None:
        """``assigner``: its candidates per box and alignment exponents (``--assigner-*``); its ``min_side`` is the
        strides' second, here, whatever it holds."""
        super().__init__()
        self.num_classes, self.strides, self.reg_max, self.gains = num_classes, strides, reg_max, gains
        # [C] multiplying each class's BCE terms (frequency_weights); a buffer, so it goes where the criterion goes.
        self.register_buffer("class_weights", class_weights, persistent=False)
        # Boxes narrower than the second stride are widened to it to find their anchors, as Ultralytics does.
        min_side = float(strides[1] if len(strides) > 1 else strides[0])
        self.assigner = replace(assigner, min_side=min_side)
        self.end_to_end = end_to_end
        self.one_to_one = replace(self.assigner, top_k=ONE_TO_ONE_TOP_K[0], top_k_after=ONE_TO_ONE_TOP_K[1])
        # A tensor filled in place (set_epoch), not a float: a captured CUDA graph reads it at each replay.
        self.register_buffer("many_weight", torch.tensor(ONE_TO_MANY_WEIGHTS[0]), persistent=False)
        self.last_assignment: Assignment | None = None  # the last call's, when it asked to keep it

    @classmethod
    def for_model(cls, model: torch.nn.Module, **options: Any) -> DetectionLoss:
        """The criterion of a built model (detector/model/yolo.py): its classes, strides, box regression and head
        branches; ``options``: the constructor's others (gains, assigner, class weights)."""
        return cls(num_classes=model.num_classes, strides=model.strides, reg_max=model.reg_max,
                   end_to_end=model.head.end_to_end, **options)

    def set_epoch(self, epoch: int, epochs: int) -> None:
        """The end-to-end branches' weights for ``epoch`` of ``epochs`` (:func:`one_to_many_weight`)."""
        self.many_weight.fill_(one_to_many_weight(epoch, epochs))

    @torch.no_grad()
    def assign(self, box_logits: torch.Tensor, cls_logits: torch.Tensor, points: torch.Tensor, stride: torch.Tensor,
               padded: PaddedTargets, config: AssignerConfig | None = None) -> AssignedTargets:
        """The assigner's targets for every image, over a few images at a time (:func:`assignment_chunks`).

        Its ``[B, M, A]`` tensors (box slots x anchors) and every anchor's decoded box (``[B, A, 4 * reg_max]`` in
        FP32 and their softmax) were the loss's peak memory, above the activations kept for the backward pass: 0.40
        GB at batch 64, 640 px and 32 box slots, where a chunk holds a fraction. Each image is assigned by itself
        (no operation mixes images), so the targets are those of the whole batch at once up to the last bit: a
        CPU computes the ends of its vectorised loops (sigmoid, pow) with the C library's scalar functions, which may
        round differently, and where a loop ends moves with the chunk's length; on CUDA the top-k's tie-breaking
        among candidates of zero alignment may depend on the row count (tests/test_loss.py bounds both). A chunk
        count that depends on shapes alone keeps one captured graph a shape."""
        config = config or self.assigner
        batch, anchors = cls_logits.shape[:2]
        chunks = assignment_chunks(batch, padded.boxes.shape[1], anchors)
        anchor_pixels = points * stride  # the same for every chunk
        if len(chunks) == 1:  # the whole batch at once (a CPU's usual batch): no copies into the batch's targets
            return self._assign_chunk(box_logits, cls_logits, (points, stride, anchor_pixels), padded, chunks[0],
                                      config)
        labels = torch.empty(batch, anchors, dtype=torch.long, device=cls_logits.device)
        boxes = torch.empty(batch, anchors, 4, device=cls_logits.device)
        scores = torch.empty(batch, anchors, self.num_classes, device=cls_logits.device)
        foreground = torch.empty(batch, anchors, dtype=torch.bool, device=cls_logits.device)
        for chunk in chunks:
            part = self._assign_chunk(box_logits, cls_logits, (points, stride, anchor_pixels), padded, chunk, config)
            labels[chunk], boxes[chunk], scores[chunk], foreground[chunk] = (
                part.labels, part.boxes, part.scores, part.foreground)
        return AssignedTargets(labels=labels, boxes=boxes, scores=scores, foreground=foreground)

    def _assign_chunk(self, box_logits: torch.Tensor, cls_logits: torch.Tensor,
                      anchors: tuple[torch.Tensor, torch.Tensor, torch.Tensor], padded: PaddedTargets,
                      chunk: slice, config: AssignerConfig) -> AssignedTargets:
        points, stride, anchor_pixels = anchors
        # Every anchor's box, for the assigner alone (the loss decodes the foreground's with gradient).
        pred_boxes = distances_to_boxes(points, dfl_expectation(box_logits[chunk].float(), self.reg_max))
        return assign_targets(cls_logits[chunk], pred_boxes * stride, anchor_pixels, padded.labels[chunk],
                              padded.boxes[chunk], padded.mask[chunk], num_classes=self.num_classes,
                              config=config)

    def forward(
        self,
        outputs: list[torch.Tensor],
        targets: torch.Tensor | PaddedTargets,
        image_hw: tuple[int, int],
        *,
        assigned: Assignment | None = None,
        across_ranks: bool = True,
        keep_assignment: bool = False,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``targets``: ``[N, 6]`` rows (padded here), or :class:`PaddedTargets` already on the device (the
        captured step's fixed-shape buffers). ``assigned``: reuse an earlier assignment (the AMP check holds it
        fixed to compare precisions; a pair for an end-to-end head). ``keep_assignment``: keep this call's in
        :attr:`last_assignment` (else None there): the AMP check's next step reuses it. Not kept otherwise: a training
        step's would stay alive through the next step's peak (its scores alone are ``[B, A, C]`` FP32: 172 MB at
        batch 64, 640 px and 80 classes).

        ``across_ranks=False`` computes this process's loss alone, with no collective call: for work that
        one rank does by itself (the AMP check), where a collective would wait forever for the others.
        """
        levels = len(self.strides)
        batch, device = outputs[0].shape[0], outputs[0].device
        # Padded where the targets are (the loader's host memory in training): sizing the padding there needs
        # no wait for the GPU; the three small results then travel to the device.
        padded = targets if isinstance(targets, PaddedTargets) else targets_to_padded(
            targets, batch, image_hw, pin=device.type == "cuda" and targets.device.type == "cpu")
        padded = PaddedTargets(*(t.to(device, non_blocking=True) for t in padded))
        global_batch = batch * (torch.distributed.get_world_size() if self._across(across_ranks) else 1)
        if len(outputs) not in (levels, 2 * levels) or (len(outputs) > levels and not self.end_to_end):
            raise ValueError(f"expected {levels} head maps (or {2 * levels} from an end-to-end head in training), "
                             f"got {len(outputs)}")
        if len(outputs) == levels:  # one branch: the usual one, or an end-to-end head's in evaluation
            total, parts, kept = self._branch(outputs, padded, image_hw, assigned, self.assigner, across_ranks)
            assignment: Assignment = kept
        else:
            many_assigned, one_assigned = assigned if isinstance(assigned, tuple) else (None, None)
            many, parts, many_kept = self._branch(outputs[:levels], padded, image_hw, many_assigned, self.assigner,
                                                  across_ranks)
            one, _, one_kept = self._branch(outputs[levels:], padded, image_hw, one_assigned, self.one_to_one,
                                            across_ranks)
            total, assignment = many * self.many_weight + one * (1 - self.many_weight), (many_kept, one_kept)
        self.last_assignment = assignment if keep_assignment else None
        return total * global_batch, {k: v.detach() for k, v in parts.items()}

    @staticmethod
    def _across(across_ranks: bool) -> bool:
        return across_ranks and torch.distributed.is_available() and torch.distributed.is_initialized()

    def _branch(self, outputs: list[torch.Tensor], padded: PaddedTargets, image_hw: tuple[int, int],
                assigned: AssignedTargets | None, config: AssignerConfig, across_ranks: bool,
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor], AssignedTargets]:
        """One head branch's gain-weighted loss (not yet times the batch), its parts, and its assignment."""
        flat = flatten_head_outputs(outputs)  # [B, A, 4*reg_max + C] in the head's dtype
        box_logits, cls_logits = flat.split((4 * self.reg_max, self.num_classes), -1)
        # A tensor of its own (in FP32): the classification loss keeps its input for the backward pass, and a view
        # would keep all of ``flat`` (and an FP32 copy of it) alive until then.
        cls_logits = cls_logits.float().contiguous()
        points, stride = make_anchors(
            [o.shape[2:] for o in outputs], self.strides, device=flat.device, dtype=torch.float32
        )
        if assigned is None:
            assigned = self.assign(box_logits, cls_logits, points, stride, padded, config)
        score_sum = assigned.scores.sum()
        if self._across(across_ranks):
            # Normalise by the target mass of the whole global batch (as DETR does with its box count):
            # the ranks' loss parts then add up to exactly what one process with that batch computes.
            torch.distributed.all_reduce(score_sum)
        score_sum = score_sum.clamp(min=1)
        cls_loss = F.binary_cross_entropy_with_logits(cls_logits, assigned.scores, weight=self.class_weights,
                                                      reduction="sum") / score_sum
        # Each box keeps at most this many positives (the one-to-one branch's: 1), so the foreground fits fewer slots.
        positives_per_box = min(config.top_k, config.top_k_after or config.top_k)
        height, width = image_hw
        # Made from the strides on the device (scalar divisions): no host tensor to copy inside a captured step.
        side_scale = torch.cat((stride / width, stride / height, stride / width, stride / height), -1) \
            if self.reg_max == 1 else None
        box_sum, dfl_sum = foreground_losses(
            box_logits, assigned.boxes / stride, points, assigned.scores.sum(-1), assigned.foreground,
            reg_max=self.reg_max, slots=foreground_slots(flat.shape[1], padded.boxes.shape[1], positives_per_box),
            side_scale=side_scale,
        )
        parts = {
            "box": box_sum / score_sum * self.gains.box,
            "cls": cls_loss * self.gains.cls,
            "dfl": dfl_sum / score_sum * self.gains.dfl,
        }
        return sum(parts.values()), parts, assigned
