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


def model_input(images: torch.Tensor, device: torch.device, *, channels_last: bool) -> torch.Tensor:
    """uint8 ``[B, 3, H, W]`` batch -> float in [0, 1] on ``device``, in the memory layout the model runs in."""
    layout = torch.channels_last if channels_last else torch.contiguous_format
    # The loader's batches are already channels-last, so on that path this is one conversion pass, no transpose.
    return images.to(device, non_blocking=True).contiguous(memory_format=layout).float().div_(255)
