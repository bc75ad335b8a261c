"""A validation pass's loss: the training criterion on the pass's own forward, as Ultralytics' val/box_loss,
val/cls_loss and val/dfl_loss columns (results.csv's ``val/box``, ``val/cls``, ``val/dfl``).

Each batch's parts are what a training step's are (:class:`~detector.loss.DetectionLoss`: gained, normalised by
the batch's target mass), on the raw head maps the pass decoded its detections from, in FP32. The pass's value is
their mean over its images: each batch weighs as many images as it holds, so a last, smaller batch (or rectangular
batches of uneven fill) counts for its images, and where every batch is full (training's batches are) it is the
mean over batches that the ``train/*`` columns are.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from detector.loss import DetectionLoss

LOSS_COLUMNS = ("val/box", "val/cls", "val/dfl")  # results.csv's, in the order of the criterion's parts
_PARTS = ("box", "cls", "dfl")
Detections = list[dict[str, torch.Tensor]]


class LossMeter:
    """Adds up a pass's batch losses on the device; :meth:`means` reads them on the host once, at the pass's end.

    A batch whose loss is not finite (a forward that overflowed FP16) is left out of the mean, as training leaves
    out such steps; a pass with no finite batch reads NaN, one with no batch at all nothing.
    """

    def __init__(self, criterion: DetectionLoss) -> None:
        self.criterion = criterion
        self.sums: torch.Tensor | None = None  # [box, cls, dfl] x images, on the maps' device
        self.images: torch.Tensor | None = None  # images of the finite batches

    @torch.no_grad()
    def add(self, maps: list[torch.Tensor], targets: torch.Tensor, image_hw: tuple[int, int]) -> None:
        """One batch: its head ``maps`` (any dtype), the loader's ``targets`` ``[N, 6]`` (normalised to the batch's
        ``image_hw`` canvas, the letterboxed or rectangular input the maps were computed on)."""
        # across_ranks=False: validation runs on rank 0 alone, where a collective would wait for the others.
        _, parts = self.criterion([m.float() for m in maps], targets, image_hw, across_ranks=False)
        batch = maps[0].shape[0]
        values = torch.stack([parts[name] for name in _PARTS])
        finite = torch.isfinite(values).all()
        weighted = torch.where(finite, values.nan_to_num(0.0) * batch, 0.0)
        counted = finite.to(torch.float32) * batch  # FP32 sums, as training's loss_sums
        self.sums = weighted if self.sums is None else self.sums + weighted
        self.images = counted if self.images is None else self.images + counted

    def means(self) -> dict[str, float]:
        """``{val/box, val/cls, val/dfl}``: the mean over the finite batches' images; empty where nothing was added."""
        if self.sums is None or self.images is None:
            return {}
        images = float(self.images)
        values = (self.sums / images).tolist() if images else [math.nan] * len(LOSS_COLUMNS)
        return dict(zip(LOSS_COLUMNS, values))


@dataclass(frozen=True)
class InferWithLoss:
    """A validation ``infer`` that also returns the head's raw maps (``make_torch_infer(..., with_maps=True)``), and
    the meter their loss goes to: :func:`~detector.metrics.loop.run_validation` calls it with each batch's targets."""

    infer: Callable[[torch.Tensor], tuple[Detections, list[torch.Tensor]]]
    meter: LossMeter

    def __call__(self, images: torch.Tensor, targets: torch.Tensor) -> Detections:
        """The batch's detections; its loss added to :attr:`meter`. The targets are normalised to the batch's
        canvas, the images' own height and width (square letterbox or rectangular batch)."""
        detections, maps = self.infer(images)
        self.meter.add(maps, targets, tuple(images.shape[2:]))
        return detections  # the maps go here: a batch's activations, not kept through the next batch's forward
