"""A training step's input: the loader's batch made into the model's float input on the step's device (mosaic and
affine warped there for a :class:`~detector.data.device_augment.WarpBatch`, pixel operations, the multi-scale
resize), and the same batch as trained, on the host, for the AMP check and the batch plot."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from detector.data.batch_augment import PixelOps, apply_pixel_ops, carried_pixel_ops
from detector.data.device_augment import WarpBatch, render, render_uint8
from detector.data.letterbox import ImageMeta
from detector.data.warp_kernel import render_fused
from detector.inference.preprocess import model_input
from detector.model.yolo import INPUT_MULTIPLE
from detector.precision import Precision


def step_input_dtype(precision: Precision, device: torch.device) -> torch.dtype:
    """The dtype a training step's input is made in: on CUDA under autocast, autocast's own (FP16 or BF16), else
    FP32.

    Autocast casts the model's FP32 input to its dtype for the first convolution, which keeps that copy for its
    backward pass: the FP32 input and its half-precision copy were both alive at the step's peak memory (0.38 GB and
    0.19 GB at batch 64 and 704 px, the default multi-scale's largest). An input made in half precision is the copy
    itself, rounded as autocast rounds (to nearest even), so the model computes the same. On the CPU the input
    stays FP32, as it was measured there."""
    if device.type == "cuda" and precision.dtype is not None:
        return precision.dtype
    return torch.float32


def step_input(
    images: torch.Tensor | WarpBatch,
    size: int,
    device: torch.device,
    *,
    channels_last: bool,
    pixel_ops: Sequence[PixelOps] | None = None,
    fused: bool = True,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """A training step's input: the loader's uint8 ``[B, 3, S, S]`` batch as float model input ``[B, 3, size, size]``
    (a ``--rect`` batch, ``[B, 3, H, W]``, its canvas scaled to a long side of ``size``: :func:`resize_batch`).

    ``pixel_ops`` (the device path, one per image) are applied on ``device`` in float, before the resize.
    A :class:`WarpBatch` (mosaic and affine left to the device) is warped there straight to ``size``; on CUDA
    warp and pixel operations run as one kernel (detector/data/warp_kernel.py; ``fused=False``: the PyTorch ops,
    for comparison). ``out`` (a captured step's input buffer, FP32 or half precision: :func:`step_input_dtype`): the
    input is written there and ``out`` returned; the kernel writes it directly, the other paths copy their result in.
    """
    if isinstance(images, WarpBatch) and fused:
        rendered = render_fused(images, device, size=size, channels_last=channels_last, pixel_ops=pixel_ops, out=out)
        if rendered is not None:
            return rendered
    made = _unfused_input(images, size, device, channels_last=channels_last, pixel_ops=pixel_ops)
    return made if out is None else out.copy_(made)


def _unfused_input(images: torch.Tensor | WarpBatch, size: int, device: torch.device, *, channels_last: bool,
                   pixel_ops: Sequence[PixelOps] | None) -> torch.Tensor:
    """:func:`step_input` with PyTorch operations."""
    if isinstance(images, WarpBatch):
        rendered = render(images, device, size=size, channels_last=channels_last)
        return rendered if pixel_ops is None else apply_pixel_ops(rendered, pixel_ops)
    if pixel_ops is not None:
        return resize_batch(apply_pixel_ops(model_input(images, device, channels_last=channels_last), pixel_ops), size)
    if device.type == "cpu":  # resize while still uint8: PyTorch's channels-last uint8 path is 2-4x faster
        return model_input(resize_batch(images, size), device, channels_last=channels_last)
    return resize_batch(model_input(images, device, channels_last=channels_last), size)  # on the GPU


def as_trained(batch: tuple[torch.Tensor, torch.Tensor, list[ImageMeta]], *, first: int | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, list[ImageMeta]]:
    """A loader batch (uint8 ``[B, 3, S, S]``) with the pixel operations it carries applied here, on the CPU.

    For the AMP check and the batch plot on the device path: their pixels then match the labels, which the
    workers flipped already. A batch without operations comes back as it is. ``first``: its first images only
    (their targets and metas too), taken before anything is rendered: the check and the plot read 8 and 16. A
    whole mosaic batch of 64 at 640 px warped on the CPU raised the process's peak memory by 1.4 GB in 1.16 s, its
    first 16 by 0.83 GB in 0.56 s (2-core Xeon; most of what is left is the atlas in FP32, 4x its 156 MiB).
    """
    images, targets, metas = batch
    if first is not None and len(images) > first:
        images = (WarpBatch(images.atlas, images.theta[:first], images.bounds[:first], images.out_size)
                  if isinstance(images, WarpBatch) else images[:first])
        targets, metas = targets[targets[:, 0] < first], metas[:first]
        batch = images, targets, metas
    if isinstance(images, WarpBatch):  # mosaic and affine left to the device: warped here, on the CPU
        images = render_uint8(images)
        batch = images, targets, metas
    pixel_ops = carried_pixel_ops([meta.pixel_ops for meta in metas])
    if pixel_ops is None:
        return batch
    pixels = apply_pixel_ops(images.float() / 255, pixel_ops).mul_(255).round_().to(torch.uint8)
    return pixels, targets, [dataclasses.replace(meta, pixel_ops=None) for meta in metas]


def resize_batch(images: torch.Tensor, size: int) -> torch.Tensor:
    """Bilinear resize of a ``[B, 3, H, W]`` batch to its shape at ``size`` (:func:`sized_shape`: a square to
    ``size x size``, a ``--rect`` batch to its canvas scaled so that its long side is ``size``), or the input itself
    when it has that shape already.

    Keeps dtype and memory layout; labels are normalised, so they need no change.
    """
    height, width = images.shape[-2:]
    shape = sized_shape(height, width, size)
    if shape == (height, width):
        return images
    return F.interpolate(images, size=shape, mode="bilinear", align_corners=False)


def sized_shape(height: int, width: int, size: int, multiple: int = INPUT_MULTIPLE) -> tuple[int, int]:
    """The (height, width) a batch of ``height x width`` trains at when multi-scale draws ``size``: its long side
    ``size``, the other scaled alike and rounded up to ``multiple`` (the model's largest stride), as Ultralytics'
    multi_scale scales a rect batch. A square is ``size x size``; a ``--rect`` canvas at ``--imgsz`` is itself."""
    longest = max(height, width)

    def scaled(side: int) -> int:  # ceil(side * size / longest / multiple) * multiple, in integers
        return -(-side * size // (longest * multiple)) * multiple

    return scaled(height), scaled(width)
