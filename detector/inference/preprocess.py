"""Pre- and post-processing shared by every backend: letterbox in, original-pixel boxes out."""

from __future__ import annotations

import numpy as np
import torch

from detector.data.letterbox import ImageMeta, letterbox, unletterbox_boxes

Detections = list[dict[str, torch.Tensor]]  # per image {boxes [N, 4] xyxy px, scores [N], labels [N]}


def prepare_batch(images_rgb: list[np.ndarray], size: int) -> tuple[torch.Tensor, list[ImageMeta]]:
    """RGB ``uint8 [H, W, 3]`` images -> ``uint8 [B, 3, size, size]`` letterboxed batch and how each was letterboxed
    (``image_id`` is the position in the batch)."""
    tensors, transforms = [], []
    for index, image in enumerate(images_rgb):
        boxed, ratio, pad = letterbox(image, size)
        tensors.append(torch.from_numpy(np.ascontiguousarray(boxed.transpose(2, 0, 1))))
        transforms.append(ImageMeta(index, image.shape[:2], ratio, pad))
    return torch.stack(tensors), transforms


def to_original_pixels(detections: dict[str, torch.Tensor], transform: ImageMeta) -> dict[str, torch.Tensor]:
    """Undo the letterbox on one image's boxes and clip them to the original image (tensors come back on CPU)."""
    detections = {key: value.cpu() for key, value in detections.items()}
    return {**detections, "boxes": unletterbox_boxes(detections["boxes"], transform)}
