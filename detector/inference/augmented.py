"""Test-time augmentation (``val --augment``, ``predict --augment``; Ultralytics' ``augment=True``): each batch is
also run flipped left-right at 0.83 of its size and unflipped at 0.67, and the three outputs' boxes, mapped back to
the input's pixels, go into one NMS, as Ultralytics' ``DetectionModel._predict_augment`` does.

Each view is a separate forward, so a pass costs about 1 + 0.83² + 0.67² = 2.1 times a plain one. The full-size
view drops its coarsest level's boxes (the largest objects) and the smallest view its finest level's (the smallest
objects): each scale keeps the objects its size sees best.

Views are made from the uint8 batch every backend takes: bilinear resize (as Ultralytics' ``scale_img``, without
antialiasing), rounded to uint8 (at most half a grey level from Ultralytics' FP32 view), padded right and bottom
to a multiple of the largest stride with grey 114 (Ultralytics' 0.447 of the range, 113.985).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from detector.inference.backend import Backend, RawOutputs

# Ultralytics' _predict_augment: (scale, flipped left-right) per view, the first the batch itself.
VIEWS: tuple[tuple[float, bool], ...] = ((1.0, False), (0.83, True), (0.67, False))
PAD_VALUE = 114  # the letterbox's grey


@dataclass(frozen=True)
class View:
    """One augmented copy of a batch: its images and how to map its boxes back."""

    images: torch.Tensor  # uint8 [B, 3, h, w]
    scale: float
    flipped: bool


def make_views(images: torch.Tensor, stride: int) -> list[View]:
    """uint8 ``[B, 3, H, W]`` -> the :data:`VIEWS` of it, each padded to a multiple of ``stride``."""
    height, width = images.shape[2:]
    views = []
    for scale, flipped in VIEWS:
        view = images.flip(3) if flipped else images
        if scale != 1.0:
            size = (int(height * scale), int(width * scale))  # truncated, as Ultralytics' scale_img
            resized = F.interpolate(view.float(), size=size, mode="bilinear", align_corners=False)
            padded = (math.ceil(height * scale / stride) * stride, math.ceil(width * scale / stride) * stride)
            view = resized.round_().clamp_(0, 255).to(torch.uint8)
            view = F.pad(view, (0, padded[1] - size[1], 0, padded[0] - size[0]), value=PAD_VALUE)
        views.append(View(view, scale, flipped))
    return views


def level_anchor_counts(height: int, width: int, strides: Sequence[int]) -> list[int]:
    """Anchors per level of an input of ``height x width`` (multiples of every stride), finest level first, the
    order of the decoded outputs (:func:`detector.postprocess.decode_outputs`)."""
    return [(height // stride) * (width // stride) for stride in strides]


def merge_views(outputs: Sequence[torch.Tensor], views: Sequence[View], width: int,
                strides: Sequence[int]) -> torch.Tensor:
    """Each view's decoded ``[B, A_i, 4 + C]`` (xyxy in the view's pixels) -> ``[B, A, 4 + C]`` in the input's
    pixels (``width``: the input's), the first view without its coarsest level, the last without its finest
    (Ultralytics' ``_descale_pred`` and ``_clip_augmented``)."""
    merged = []
    for index, (output, view) in enumerate(zip(outputs, views)):
        counts = level_anchor_counts(*view.images.shape[2:], strides)
        if output.shape[1] != sum(counts):
            raise ValueError(f"a view of {tuple(view.images.shape[2:])} px gave {output.shape[1]} boxes; its levels "
                             f"(strides {tuple(strides)}) have {sum(counts)}")
        if index == 0:
            output = output[:, : -counts[-1]]
        if index == len(views) - 1:
            output = output[:, counts[0]:]
        boxes = output[..., :4] / view.scale
        if view.flipped:
            boxes = torch.stack((width - boxes[..., 2], boxes[..., 1], width - boxes[..., 0], boxes[..., 3]), -1)
        merged.append(torch.cat((boxes, output[..., 4:]), -1))
    return torch.cat(merged, 1)


def augmented(forward: Callable[[torch.Tensor], torch.Tensor], images: torch.Tensor,
              strides: Sequence[int]) -> torch.Tensor:
    """``forward(uint8 [B, 3, h, w]) -> decoded [B, A, 4 + C]`` run on each view of ``images``, merged."""
    views = make_views(images, max(strides))
    return merge_views([forward(view.images) for view in views], views, images.shape[3], strides)


def augment_problem(backend: Backend) -> str | None:
    """Why ``backend`` cannot run augmented (one line), or None: the views are smaller inputs, so its graph must take
    any shape, and their boxes meet in one NMS, so it must not have NMS inside, nor be end-to-end (NMS-free)."""
    if backend.info.end_to_end:  # the views' boxes would meet without NMS: one object, up to three boxes
        return "--augment merges its views' boxes with NMS: an end-to-end (NMS-free) model has none to merge them"
    if backend.info.nms is not None:
        return "--augment needs the boxes before NMS: this export has NMS inside (export without --nms)"
    if not backend.info.dynamic:
        return (f"--augment runs smaller views of each image: this export takes {backend.info.imgsz} px alone "
                "(export with --dynamic, or use the .pt weights)")
    return None


class AugmentedBackend(Backend):
    """``backend`` run on each view (:func:`augmented`); ``ValueError`` from :func:`augment_problem` for one that
    cannot be."""

    def __init__(self, backend: Backend) -> None:
        if problem := augment_problem(backend):
            raise ValueError(problem)
        super().__init__(backend.info, backend.nms)
        self.backend = backend
        self.shapes_are_free = backend.shapes_are_free
        if hasattr(backend, "device"):  # predict overlaps uploads with the model where it runs on CUDA
            self.device = backend.device

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"{self.backend.name}, augmented"

    def infer(self, images: torch.Tensor) -> RawOutputs:
        self.check_input(images)
        images = images.to(getattr(self, "device", images.device))  # the views are made where the model runs
        decoded = augmented(lambda view: torch.cat(self.backend.infer(view), -1), images, self.info.strides)
        return decoded[..., :4], decoded[..., 4:]

    def close(self) -> None:
        self.backend.close()
