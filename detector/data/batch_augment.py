"""Pixel augmentation of a whole batch as tensors: HSV (a hue shift, saturation and value gains), flips and the
channel swap (``--bgr``), on whatever device the batch is on.

The loader workers draw each image's operations (:class:`PixelOps`, from the same random numbers as the
OpenCV path in :mod:`detector.data.augment`) and flip its boxes; the training step applies the pixel side
here, batched, after the batch reaches the device (issue 16: on a GPU the CPU workers are the wall), and
after the warp where mosaic and affine run there too (:mod:`detector.data.device_augment`).
Images are float ``[B, 3, H, W]`` RGB in [0, 1]; hue is in turns ([0, 1) = 0-360 degrees).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from detector.choices import PIXEL_AUGMENT as CHOICES
from detector.data.augment import HSV_UNCHANGED


@dataclass(frozen=True)
class PixelOps:
    """One image's pixel augmentation: HSV (detector.data.augment.draw_hsv), flips and the channel swap
    (detector.data.augment.draw_channel_swap), applied in that order."""

    hue_shift: float = 0.0  # added to the hue, in turns, modulo a full turn
    saturation_gain: float = 1.0  # multiplies the saturation, clipped to [0, 1]
    value_gain: float = 1.0  # multiplies the value (max channel), clipped to [0, 1]
    flip_lr: bool = False  # mirror left-right
    flip_ud: bool = False  # mirror top-bottom
    swap_channels: bool = False  # reverse the channel order (RGB -> BGR), last

    @property
    def hsv(self) -> tuple[float, float, float]:
        return self.hue_shift, self.saturation_gain, self.value_gain


def resolve_pixel_augment(choice: str, device: torch.device) -> str:
    """``--pixel-augment`` -> where augmentation runs: ``"workers"``, ``"pixels"`` or ``"device"``.

    ``workers``: everything in the loader processes (OpenCV). ``pixels``: HSV and flips in the step, batched
    (here); mosaic and affine in the workers. ``device``: mosaic and affine in the step too
    (:mod:`detector.data.device_augment`); decoding, the random draws, the boxes and albumentations stay in
    the workers. ``auto`` is ``device`` on CUDA only: on a CPU the step and the workers share the same cores,
    and the workers' OpenCV (fixed-point warp, uint8 lookup tables) costs less than float sampling and HSV
    in the step (docs/gpu.md, "Augmentation on the device").
    """
    if choice not in CHOICES:
        raise ValueError(f"--pixel-augment must be one of {', '.join(CHOICES)} (got {choice!r})")
    if choice == "auto":
        return "device" if device.type == "cuda" else "workers"
    return choice


def carried_pixel_ops(ops: Sequence[PixelOps | None]) -> list[PixelOps] | None:
    """A batch's per-image operations when its items carry them (the device path), else None.

    An item without operations (none are expected in a batch that has some) is left unchanged.
    """
    if all(op is None for op in ops):
        return None
    return [op or PixelOps() for op in ops]


def rgb_to_hsv(rgb: torch.Tensor) -> torch.Tensor:
    """``[B, 3, H, W]`` RGB in [0, 1] -> HSV: hue in turns [0, 1), saturation and value in [0, 1]."""
    red, green, blue = rgb.unbind(1)
    value = rgb.amax(1)
    chroma = value - rgb.amin(1)
    safe_chroma = torch.where(chroma > 0, chroma, torch.ones_like(chroma))  # grey pixels: hue 0, no 0/0
    sector = torch.where(  # position around the colour wheel in sixths of a turn, by which channel is largest
        value == red,
        (green - blue) / safe_chroma,
        torch.where(value == green, (blue - red) / safe_chroma + 2, (red - green) / safe_chroma + 4),
    )
    hue = torch.where(chroma > 0, (sector / 6) % 1.0, torch.zeros_like(chroma))
    saturation = chroma / torch.where(value > 0, value, torch.ones_like(value))
    return torch.stack((hue, saturation, value), 1)


def hsv_to_rgb(hsv: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`rgb_to_hsv` for ``[B, 3, H, W]`` HSV, any real hue (in turns, taken modulo 1).

    Channel ``n`` (5, 3, 1 for R, G, B) is ``v - v*s*clamp(min(k, 4-k), 0, 1)`` with ``k = (n + 6*hue) mod 6``.
    """
    hue, saturation, value = hsv[:, 0:1], hsv[:, 1:2], hsv[:, 2:3]
    offsets = torch.arange(5, 0, -2, dtype=hsv.dtype, device=hsv.device).view(1, 3, 1, 1)  # 5, 3, 1: made there
    k = (offsets + 6 * hue) % 6
    return value - value * saturation * torch.minimum(k, 4 - k).clamp(0, 1)


TABLE_COLUMNS = 6  # a row of pixel_ops_table: hue shift, saturation gain, value gain, flip_lr, flip_ud, swap_channels


def pixel_ops_table(
    ops: Sequence[PixelOps], device: torch.device, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``[B, 6]`` on ``device``: each image's hue shift, saturation and value gains, then its left-right and top-bottom
    flip flags and its channel-swap flag (1 or 0): what :func:`apply_pixel_ops` and the fused kernel
    (detector/data/warp_kernel.py, which reads a row as :data:`TABLE_COLUMNS` numbers) read.

    One small copy per batch. From pageable memory with non_blocking, CUDA stages it at once instead of waiting
    for the queued work of the previous step.
    """
    table = torch.tensor([(*op.hsv, op.flip_lr, op.flip_ud, op.swap_channels) for op in ops], dtype=dtype)
    return table.to(device, non_blocking=True)


def changes_colour(ops: Sequence[PixelOps]) -> bool:
    """Whether any image's HSV operations change it (otherwise the HSV round trip is skipped)."""
    return any(op.hsv != HSV_UNCHANGED for op in ops)


def apply_pixel_ops(images: torch.Tensor, ops: Sequence[PixelOps]) -> torch.Tensor:
    """Apply each image's HSV operations, then its flips, then its channel swap, to float ``[B, 3, H, W]`` RGB in
    [0, 1].

    Returns a new batch in [0, 1] with the input's dtype, device and memory format; the input is unchanged.
    """
    if len(ops) != len(images):
        raise ValueError(f"{len(ops)} pixel operations for a batch of {len(images)} images")
    layout = torch.channels_last if images.is_contiguous(memory_format=torch.channels_last) else torch.contiguous_format
    params = pixel_ops_table(ops, images.device, images.dtype)[:, :, None, None]
    out = images
    if changes_colour(ops):
        hsv = rgb_to_hsv(images)  # a new tensor: changed in place
        hsv[:, :1] += params[:, :1]  # hsv_to_rgb takes the hue modulo a turn
        hsv[:, 1:] *= params[:, 1:3]
        hsv[:, 1:].clamp_(0, 1)  # saturation and value
        out = hsv_to_rgb(hsv)
    if any(op.flip_lr for op in ops):
        out = torch.where(params[:, 3:4] > 0, out.flip(3), out)
    if any(op.flip_ud for op in ops):
        out = torch.where(params[:, 4:5] > 0, out.flip(2), out)
    if any(op.swap_channels for op in ops):
        out = torch.where(params[:, 5:6] > 0, out.flip(1), out)
    return out.clone(memory_format=layout) if out is images else out.contiguous(memory_format=layout)
