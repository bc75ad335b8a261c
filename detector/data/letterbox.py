"""The letterbox, its record and its undo: the one place that maps between original and model-input pixels.

Evaluation, prediction and benchmarking all resize an image so its long side is ``size`` and pad it to
``size x size``; :class:`ImageMeta` records how, and :func:`unletterbox_boxes` maps boxes back.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np
import torch

from detector.data.augment import PAD_VALUE
from detector.data.batch_augment import PixelOps


@dataclass(frozen=True)
class ImageMeta:
    """How one image became model input: ``letterboxed = original * ratio + pad``."""

    image_id: int  # the dataset's id; position in the batch where there is no dataset (predict)
    original_hw: tuple[int, int]
    ratio: float
    pad: tuple[float, float]  # (left, top) pixels
    # Training on the device path (--pixel-augment device): the HSV gains and flips the training step still
    # has to apply to the pixels (the worker flipped the boxes already). None: nothing left to apply.
    pixel_ops: PixelOps | None = None
    # Training and evaluation items: the path of an image that failed to decode and was replaced (training)
    # or scored blank (evaluation) in this item; "" when none did.
    unreadable: str = ""


def letterbox(image: np.ndarray, size: int) -> tuple[np.ndarray, float, tuple[float, float]]:
    """Resize keeping aspect ratio so the long side is ``size``, pad to ``size x size``.

    Returns the image, the scale ratio and the (left, top) padding in pixels: original coordinates map
    to letterboxed ones as ``x * ratio + pad``.
    """
    height, width = image.shape[:2]
    ratio = size / max(height, width)
    new_w, new_h = round(width * ratio), round(height * ratio)
    if (new_w, new_h) != (width, height):
        image = cv2.resize(image, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
    left, top = (size - new_w) // 2, (size - new_h) // 2
    image = cv2.copyMakeBorder(
        image, top, size - new_h - top, left, size - new_w - left, cv2.BORDER_CONSTANT, value=(PAD_VALUE,) * 3
    )
    return image, ratio, (float(left), float(top))


def unletterbox_boxes(boxes: torch.Tensor, meta: ImageMeta) -> torch.Tensor:
    """``[N, 4]`` xyxy pixels of the letterboxed input -> xyxy pixels of the original image (clipped), FP32 on CPU."""
    boxes = boxes.detach().float().cpu().reshape(-1, 4).clone()
    height, width = meta.original_hw
    boxes[:, [0, 2]] = ((boxes[:, [0, 2]] - meta.pad[0]) / meta.ratio).clamp(0, width)
    boxes[:, [1, 3]] = ((boxes[:, [1, 3]] - meta.pad[1]) / meta.ratio).clamp(0, height)
    return boxes
