"""The device path's augmentation in one pass on CUDA: warp, HSV, flips, channel swap and the scaling to [0, 1],
fused.

:func:`detector.data.device_augment.render` and :func:`detector.data.batch_augment.apply_pixel_ops` are
plain PyTorch: about 50 kernels a batch, each reading and writing the whole float batch. At batch 64 and
640 px that is ~20 GB of memory traffic a step (counted with a dispatch mode over the two calls), 6-8 ms of an
H100's bandwidth beside a graphed step of ~35 ms: the largest part of what the loop adds to its step alone
(issue 29). The kernel here reads each output pixel's four atlas neighbours (uint8) once and writes the
finished float pixel once: ~0.4 GB.

It computes what the two PyTorch functions compute, in the same order and with the same formulas: the output
pixel's flipped position, its sample point (``affine_grid``, the clamp to the image's region, ``grid_sample``'s
bilinear weights and zero padding), then ``rgb_to_hsv``, the hue shift and gains, ``hsv_to_rgb``, and the channel
swap (``--bgr``) as the order of its stores, which moves values without changing them. Only float32 rounding
differs: the order of the coordinate arithmetic, and compiled for a GPU, Triton's divisions (within 2 ulp, not
correctly rounded) and fused multiply-adds (tests/data/test_warp_kernel.py derives the bound).

Used on CUDA when Triton imports (it ships with PyTorch's CUDA wheels); a kernel that fails to build or launch
says so in one line and the PyTorch functions take over for the rest of the process. Triton's interpreter
(``TRITON_INTERPRET=1``) runs the same kernel on CPU tensors: that is how the tests check it without a GPU.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable, Sequence

import torch

from detector.data.batch_augment import TABLE_COLUMNS, PixelOps, changes_colour, pixel_ops_table
from detector.data.device_augment import WarpBatch

BLOCK = 1024  # output pixels per program
_failed: list[str] = []  # the first failure's line: the PyTorch path for the rest of the process
# A launch costs tens of microseconds of host time; a variant's first launch that takes longer than this compiled
# the kernel (or loaded it from Triton's cache on disk), a one-time cost of the run's first steps that the log names.
SLOW_FIRST_LAUNCH_S = 0.05
_launched: set[tuple[torch.dtype, bool]] = set()  # the variants (output type, HSV) launched in this process


def fused_unavailable(device: torch.device) -> str | None:
    """Why the fused kernel cannot render on ``device``, or None when it can.

    The CPU keeps the PyTorch path (the kernel runs there only under Triton's interpreter, for tests).
    """
    if device.type != "cuda" and not interpreting():
        return "not a CUDA device"
    if _failed:
        return _failed[0]
    try:
        _kernel(interpreting())
    except Exception as error:  # not installed, or a build whose import fails (any error type): said once
        _give_up(f"triton is not usable ({type(error).__name__}: {str(error).splitlines()[0]})")
        return _failed[0]
    return None


def _give_up(reason: str) -> None:
    """The PyTorch ops from now on, said in one line."""
    _failed.append(reason)
    print(f"device augmentation: {reason}; using PyTorch ops", flush=True)


def interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter (on CPU tensors): ``TRITON_INTERPRET=1``."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# What the kernel can write: it computes in FP32 and its stores round to the buffer's type (round to nearest even, as
# autocast's cast of an FP32 input does), so a half-precision step input holds what the model's first convolution
# would have read.
OUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def render_fused(
    batch: WarpBatch, device: torch.device, *, size: int, channels_last: bool, pixel_ops: Sequence[PixelOps] | None,
    out: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """Every image of ``batch`` warped to ``size``, its pixel operations applied: float ``[B, 3, size, size]`` RGB
    in [0, 1] on ``device``, as ``apply_pixel_ops(render(batch, ...), pixel_ops)`` would give. ``out``: written
    there (any strides; FP32, or FP16 / BF16 rounded from the kernel's FP32) instead of a new tensor, and returned.

    None when the kernel cannot run here (:func:`fused_unavailable`) or failed just now (said in one line): the
    caller renders with PyTorch.
    """
    if fused_unavailable(device) is not None:
        return None
    count = len(batch)
    if pixel_ops is not None and len(pixel_ops) != count:
        raise ValueError(f"{len(pixel_ops)} pixel operations for a batch of {count} images")
    ops = [op or PixelOps() for op in pixel_ops] if pixel_ops is not None else [PixelOps()] * count
    table = pixel_ops_table(ops, device)
    atlas, theta, bounds = (tensor.contiguous() for tensor in batch.to(device, non_blocking=True).tensors())
    if out is None:
        layout = torch.channels_last if channels_last else torch.contiguous_format
        out = torch.empty((count, 3, size, size), dtype=torch.float32, device=device, memory_format=layout)
    elif (out.shape != (count, 3, size, size) or out.dtype not in OUT_DTYPES
          or out.device.type != device.type):
        raise ValueError(f"out is {out.dtype} {list(out.shape)} on {out.device}; this batch renders float "
                         f"{[count, 3, size, size]} on {device}")
    height, width = atlas.shape[:2]
    pixels = count * size * size
    # Triton launches on the current CUDA device: make it the batch's (a run on cuda:1 need not have made it so).
    current = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    hsv = changes_colour(ops)

    def launch() -> None:
        _kernel(interpreting())[(-(-pixels // BLOCK),)](
            atlas, theta, bounds, table, out, height, width, size, pixels, *out.stride(), HSV=hsv,
            COLUMNS=TABLE_COLUMNS, BLOCK=BLOCK,
        )

    try:
        with current:
            timed_launch(launch, (out.dtype, hsv), report=device.type == "cuda")
    except Exception as error:  # a Triton or driver build failure of any type: PyTorch renders from now on
        _give_up(f"fused augmentation kernel failed ({type(error).__name__}: {str(error).splitlines()[0]})")
        return None
    return out


def timed_launch(launch: Callable[[], None], variant: tuple[torch.dtype, bool], *, report: bool) -> None:
    """Run ``launch``; the first launch of a ``variant`` (output type, HSV) that takes
    :data:`SLOW_FIRST_LAUNCH_S` or longer on the host is said in one line (``report``): Triton compiled it then.
    A fresh machine compiles each variant once, in a run's first steps (issue 33's first epoch against a steady
    one); later runs load it from Triton's cache on disk."""
    started = time.perf_counter()
    launch()
    seconds = time.perf_counter() - started
    if report and variant not in _launched and seconds >= SLOW_FIRST_LAUNCH_S:
        dtype, hsv = variant
        print(f"device augmentation: the fused kernel's first launch ({str(dtype).removeprefix('torch.')}"
              f"{', HSV' if hsv else ''}) took {seconds:.2f} s: Triton compiling it, or loading it from its cache "
              "on disk", flush=True)
    _launched.add(variant)


@functools.cache
def _kernel(interpret: bool):  # noqa: ARG001 - the cache key: an interpreted kernel is a different object
    """The Triton kernel, defined on first use: importing Triton costs start-up time that CPU runs never need."""
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["height", "width", "size", "pixels"])
    def warp_augment(atlas, theta, bounds, table, out, height, width, size, pixels,
                     stride_b, stride_c, stride_y, stride_x, HSV: tl.constexpr, COLUMNS: tl.constexpr,
                     BLOCK: tl.constexpr):
        index = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        live = index < pixels
        per_image = size.to(tl.int64) * size
        image = index // per_image
        y = (index % per_image) // size
        x = index % size
        ops = table + image * COLUMNS  # the image's row of batch_augment.pixel_ops_table
        hue_shift = tl.load(ops, mask=live, other=0.0)
        saturation_gain = tl.load(ops + 1, mask=live, other=1.0)
        value_gain = tl.load(ops + 2, mask=live, other=1.0)
        flip_lr = tl.load(ops + 3, mask=live, other=0.0)
        flip_ud = tl.load(ops + 4, mask=live, other=0.0)
        swap = tl.load(ops + 5, mask=live, other=0.0)
        # A flip mirrors the finished image, and everything before it is per pixel: sample the mirrored pixel.
        x = tl.where(flip_lr > 0, size - 1 - x, x)
        y = tl.where(flip_ud > 0, size - 1 - y, y)
        # affine_grid (align_corners=False): pixel centre x <-> (2x + 1) / size - 1, then theta's three terms.
        normal_x = (2 * x + 1).to(tl.float32) / size - 1
        normal_y = (2 * y + 1).to(tl.float32) / size - 1
        row = theta + image * 6
        grid_x = (tl.load(row, mask=live) * normal_x + tl.load(row + 1, mask=live) * normal_y
                  + tl.load(row + 2, mask=live))
        grid_y = (tl.load(row + 3, mask=live) * normal_x + tl.load(row + 4, mask=live) * normal_y
                  + tl.load(row + 5, mask=live))
        bound = bounds + image * 4
        grid_x = tl.minimum(tl.maximum(grid_x, tl.load(bound, mask=live)), tl.load(bound + 2, mask=live))
        grid_y = tl.minimum(tl.maximum(grid_y, tl.load(bound + 1, mask=live)), tl.load(bound + 3, mask=live))
        # grid_sample (bilinear, zeros padding, align_corners=False) over the atlas as one [3, height, width] image.
        source_x = ((grid_x + 1) * width - 1) / 2
        source_y = ((grid_y + 1) * height - 1) / 2
        left = tl.floor(source_x)
        top = tl.floor(source_y)
        left_i = left.to(tl.int64)
        top_i = top.to(tl.int64)
        red = tl.zeros([BLOCK], tl.float32)
        green = tl.zeros([BLOCK], tl.float32)
        blue = tl.zeros([BLOCK], tl.float32)
        for corner in tl.static_range(4):
            column = left_i + (corner % 2)
            line = top_i + (corner // 2)
            # grid_sample's weights: the distance to the opposite neighbour, (left + 1 - x) for the left one
            weight_x = source_x - left if corner % 2 == 1 else (left + 1) - source_x
            weight_y = source_y - top if corner // 2 == 1 else (top + 1) - source_y
            inside = live & (column >= 0) & (column < width) & (line >= 0) & (line < height)
            pixel = atlas + (line * width + column) * 3
            weight = weight_x * weight_y
            red += weight * tl.load(pixel, mask=inside, other=0).to(tl.float32)
            green += weight * tl.load(pixel + 1, mask=inside, other=0).to(tl.float32)
            blue += weight * tl.load(pixel + 2, mask=inside, other=0).to(tl.float32)
        red = red / 255
        green = green / 255
        blue = blue / 255
        if HSV:  # detector.data.batch_augment's rgb_to_hsv, the shift and gains, hsv_to_rgb
            value = tl.maximum(tl.maximum(red, green), blue)
            chroma = value - tl.minimum(tl.minimum(red, green), blue)
            safe_chroma = tl.where(chroma > 0, chroma, 1.0)
            sector = tl.where(value == red, (green - blue) / safe_chroma,
                              tl.where(value == green, (blue - red) / safe_chroma + 2, (red - green) / safe_chroma + 4))
            turns = sector / 6
            hue = tl.where(chroma > 0, turns - tl.floor(turns), 0.0)  # modulo one turn
            saturation = chroma / tl.where(value > 0, value, 1.0)
            hue = hue + hue_shift
            saturation = tl.minimum(tl.maximum(saturation * saturation_gain, 0.0), 1.0)
            value = tl.minimum(tl.maximum(value * value_gain, 0.0), 1.0)
            k = 5 + 6 * hue
            k = k - 6 * tl.floor(k / 6)
            red = value - value * saturation * tl.minimum(tl.maximum(tl.minimum(k, 4 - k), 0.0), 1.0)
            k = 3 + 6 * hue
            k = k - 6 * tl.floor(k / 6)
            green = value - value * saturation * tl.minimum(tl.maximum(tl.minimum(k, 4 - k), 0.0), 1.0)
            k = 1 + 6 * hue
            k = k - 6 * tl.floor(k / 6)
            blue = value - value * saturation * tl.minimum(tl.maximum(tl.minimum(k, 4 - k), 0.0), 1.0)
        # Stored at the unflipped position (the one this program was given).
        out_x = index % size
        out_y = (index % per_image) // size
        target = out + image * stride_b + out_y * stride_y + out_x * stride_x
        # The channel swap, last as in apply_pixel_ops: blue stored first and red last, the values untouched.
        tl.store(target, tl.where(swap > 0, blue, red), mask=live)
        # The last channel one step past the middle one, not 2 * stride_c past the first: the step is a 32-bit
        # argument while it fits, and twice it may not (a channel-outermost view of 2**30 pixels and more wrapped
        # to negative).
        green_at = target + stride_c
        tl.store(green_at, green, mask=live)
        tl.store(green_at + stride_c, tl.where(swap > 0, red, blue), mask=live)

    return warp_augment
