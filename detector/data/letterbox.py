"""The letterbox, its record and its undo: the one place that maps between original and model-input pixels.

Evaluation, prediction and benchmarking all resize an image so its long side is ``size`` and pad it to
``size x size`` (or, in rectangular evaluation batches, to its batch's canvas: :func:`rect_batches`);
:class:`ImageMeta` records how, and :func:`unletterbox_boxes` (one image) or :func:`unletterbox_rows` (a batch)
map boxes back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import cv2
import numpy as np
import torch

from detector.data.augment import PAD_VALUE
from detector.data.batch_augment import PixelOps

# Every resize of an image on its way into the model (training, validation, predict) is bilinear,
# as Ultralytics 8.4 resizes (data/base.py load_image, LetterBox) and as the CUDA letterbox's ``interpolate`` does,
# so validation scores the very pixels predict feeds the model. INTER_AREA antialiases a strong shrink, but then
# training and validation would see inputs predict never produces.
RESIZE_INTERPOLATION = cv2.INTER_LINEAR


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
    # The (height, width) the original was resized to before padding. Each side is rounded to whole pixels, so
    # its own scale (``resized / original``) differs from ``ratio`` by up to half a pixel over the side: boxes map
    # back by it (:func:`unletterbox_rows`). None: ``ratio`` on both axes.
    resized_hw: tuple[int, int] | None = None

    @property
    def scale_xy(self) -> tuple[float, float]:
        """The x and y scales from the original to the letterboxed pixels."""
        if self.resized_hw is None:
            return self.ratio, self.ratio
        return self.resized_hw[1] / self.original_hw[1], self.resized_hw[0] / self.original_hw[0]


def letterbox(
    image: np.ndarray, size: int, canvas: tuple[int, int] | None = None
) -> tuple[np.ndarray, float, tuple[float, float]]:
    """Resize keeping aspect ratio so the long side is ``size``, pad to ``canvas`` (height, width; default
    ``size x size``), centred. An image that would not fit the canvas (its file changed since the scan that sized
    the canvas) is scaled down until it does: the ratio says so, and boxes still map back.

    Returns the image, the scale ratio and the (left, top) padding in pixels: original coordinates map
    to letterboxed ones as ``x * ratio + pad``.
    """
    height, width = image.shape[:2]
    canvas_h, canvas_w = canvas or (size, size)
    ratio = min(size / max(height, width), canvas_h / height, canvas_w / width)
    # At least one pixel: a 4000x1 strip scaled to 640 would round its short side to nothing (cv2.resize refuses).
    new_h, new_w = resized_size(height, width, ratio)
    if (new_w, new_h) != (width, height):
        image = cv2.resize(image, (new_w, new_h), interpolation=RESIZE_INTERPOLATION)
    left, top = (canvas_w - new_w) // 2, (canvas_h - new_h) // 2
    image = cv2.copyMakeBorder(
        image, top, canvas_h - new_h - top, left, canvas_w - new_w - left, cv2.BORDER_CONSTANT,
        value=(PAD_VALUE,) * 3,
    )
    return image, ratio, (float(left), float(top))


def resized_size(height: int, width: int, ratio: float) -> tuple[int, int]:
    """The (height, width) :func:`letterbox` resizes an image of this size to at ``ratio``: at least a pixel a side."""
    return max(1, round(height * ratio)), max(1, round(width * ratio))


def rect_batches(image_hw: np.ndarray, size: int, batch: int, multiple: int) -> tuple[np.ndarray, np.ndarray]:
    """Evaluation batches of similar shape, each padded only as far as its images need (Ultralytics' rect val, less
    the half stride of padding it adds to every side: 640x480 at 320 px is 256x320 here, 256x352 there).

    Images are ordered by aspect ratio (height / width) and cut into batches of ``batch`` in that order. A batch
    of landscape images gets the canvas ``size * max(h / w) x size``, one of portrait images ``size x size *
    max(w / h)``, a mixed one the square; each side rounded up to ``multiple`` (the model's largest stride). The
    long side of every image is still ``size``, so the model sees the same pixels at the same scale as in the
    square letterbox, minus padding: 640x480 images at 640 px run at 640x480 instead of 640x640.

    Returns the order (dataset indices, batch after batch) and each image's canvas ``[N, 2]`` (height, width).
    """
    heights, widths = (image_hw[:, 0].astype(np.float64), image_hw[:, 1].astype(np.float64))
    aspect = heights / np.maximum(widths, 1)
    order = np.argsort(aspect, kind="stable")
    canvases = np.empty((len(image_hw), 2), np.int64)
    for start in range(0, len(order), batch):
        members = order[start : start + batch]
        low, high = aspect[members].min(), aspect[members].max()
        shape = (high, 1.0) if high < 1 else (1.0, 1 / low) if low > 1 else (1.0, 1.0)
        canvases[members] = np.ceil(np.array(shape) * size / multiple - 1e-9).astype(np.int64) * multiple
    return order, canvases


def unletterbox_boxes(boxes: torch.Tensor, meta: ImageMeta) -> torch.Tensor:
    """``[N, 4]`` xyxy pixels of the letterboxed input -> xyxy pixels of the original image (clipped), FP32 on CPU."""
    return unletterbox_rows(boxes, [meta], [len(boxes.reshape(-1, 4))])


def unletterbox_rows(boxes: torch.Tensor, metas: Sequence[ImageMeta], counts: Sequence[int]) -> torch.Tensor:
    """:func:`unletterbox_boxes` for a batch in one pass: ``boxes`` holds ``counts[i]`` rows of image ``metas[i]``,
    image after image (``[sum(counts), 4]``). FP32 on CPU.

    Each row gets its image's pad, ratio and size as FP32 numbers, which is what torch makes of the Python floats
    of a per-image ``(x - pad) / ratio``, so a box comes out the same to the bit whichever way it went. Per image
    the same took ~0.14 ms on a 2-core EPYC, 4 ms for a batch of 32.
    """
    boxes = boxes.detach().float().cpu().reshape(-1, 4)
    pad = torch.tensor([meta.pad * 2 for meta in metas], dtype=torch.float32)
    ratio = torch.tensor([meta.scale_xy * 2 for meta in metas], dtype=torch.float32)
    size = torch.tensor([meta.original_hw[::-1] * 2 for meta in metas], dtype=torch.float32)
    if len(metas) > 1:  # each row its own image's numbers; a single image's broadcast as they are
        image_of_row = torch.repeat_interleave(torch.tensor(counts, dtype=torch.long))
        pad, ratio, size = pad[image_of_row], ratio[image_of_row], size[image_of_row]
    return torch.minimum(((boxes - pad) / ratio).clamp_(min=0), size)
