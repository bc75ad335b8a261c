"""Pre- and post-processing shared by every backend: letterbox in, original-pixel boxes out."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from detector.data.augment import letterbox

Detections = list[dict[str, torch.Tensor]]  # per image {boxes [N, 4] xyxy px, scores [N], labels [N]}


@dataclass(frozen=True)
class Letterbox:
    """How one image was letterboxed: ``letterboxed = original * ratio + pad``."""

    original_hw: tuple[int, int]
    ratio: float
    pad: tuple[float, float]  # (left, top) pixels


def prepare_batch(images_rgb: list[np.ndarray], size: int) -> tuple[torch.Tensor, list[Letterbox]]:
    """RGB ``uint8 [H, W, 3]`` images -> ``uint8 [B, 3, size, size]`` letterboxed batch and the transforms."""
    tensors, transforms = [], []
    for image in images_rgb:
        boxed, ratio, pad = letterbox(image, size)
        tensors.append(torch.from_numpy(np.ascontiguousarray(boxed.transpose(2, 0, 1))))
        transforms.append(Letterbox(image.shape[:2], ratio, pad))
    return torch.stack(tensors), transforms


def to_original_pixels(detections: dict[str, torch.Tensor], transform: Letterbox) -> dict[str, torch.Tensor]:
    """Undo the letterbox on one image's boxes and clip them to the original image (tensors come back on CPU)."""
    detections = {key: value.cpu() for key, value in detections.items()}
    left, top = transform.pad
    height, width = transform.original_hw
    boxes = (detections["boxes"].float() - torch.tensor([left, top, left, top])) / transform.ratio
    boxes[:, 0::2] = boxes[:, 0::2].clamp(0, width)
    boxes[:, 1::2] = boxes[:, 1::2].clamp(0, height)
    return {**detections, "boxes": boxes}
