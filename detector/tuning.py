"""Process-wide settings of the kernel libraries and the C heap, applied when a run or a command starts.

- oneDNN kernel cache (every command, first thing): multi-scale training cycles its input sizes through ~65
  convolutions x 3 kernels each, over oneDNN's default 1024-entry cache, so every size change rebuilt its
  kernels. With room for all of them a bare multi-scale step ran ~10% faster on a 2-core CPU.
- Freed memory kept in the heap (training, validation, prediction and benchmarks on the CPU): glibc handed large
  freed blocks back to the kernel, so every step faulted in fresh zeroed pages for the same activations; kept,
  bare steps ran ~11% faster, peak resident memory ~4% higher. Inference pays the same from a batch of a few
  images at 640 px up, where activations outgrow glibc's largest mmap threshold (32 MiB): eager PyTorch at batch
  8 faulted in ~400 MB per call (docs/inference.md). Skipped when you tune malloc yourself, and off glibc.
- cuDNN autotuning (training on CUDA, once the run's input shapes and length are known): its timing is paid
  once per input shape, and on an H100 a new shape cost an epoch of 12-13 s instead of ~1 s (BCCD, 640 px,
  batch 16, five multi-scale shapes: ~45 s of a 283 s run went to it). It is on only where it can pay that
  back: at most ``MAX_AUTOTUNED_SHAPES`` shapes and at least ``MIN_STEPS_PER_AUTOTUNED_SHAPE`` training steps per
  shape; elsewhere heuristics choose (as detectron2 and torchvision do when sizes vary, and as Ultralytics
  always does). ``--cudnn-benchmark on|off`` overrides it. The break-even is an estimate (below), not measured.

The measurements behind each, with their commands: docs/benchmarks.md, "Where the CPU time goes", and
docs/multiscale.md, "cuDNN autotuning".
"""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

import torch

from detector.choices import CUDNN_BENCHMARK as BENCHMARK_CHOICES

ONEDNN_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
ONEDNN_CACHE_CAPACITY = 8192


def enlarge_onednn_cache(capacity: int = ONEDNN_CACHE_CAPACITY) -> None:
    """Ask oneDNN for a larger kernel cache, unless the user already chose a size.

    oneDNN reads the variable when it first builds a kernel, so this must run before the first convolution
    of the process: :func:`tune_process` calls it first thing for training, val, predict and benchmark, and export
    calls it alone. Importing ``detector`` changes nothing in the environment.
    """
    os.environ.setdefault(ONEDNN_CACHE_ENV, str(capacity))


# mallopt(3) parameter numbers, from glibc's <malloc.h>.
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
_USER_MALLOC_ENV = ("GLIBC_TUNABLES", "MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")


def on_glibc() -> bool:
    """Linux with the GNU C library, whose malloc ``hold_freed_memory`` tunes."""
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def hold_freed_memory() -> bool:
    """Make glibc keep freed memory for reuse instead of returning it to the kernel; True when applied.

    Resident memory then stays at the run's peak, which it reaches in the first steps anyway. A no-op off
    glibc, and when the user tuned malloc through the environment.
    """
    if not on_glibc() or any(name in os.environ for name in _USER_MALLOC_ENV):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # No mmap-served blocks (so no unmapping on free), and a top-of-heap trim only above 2 GiB free.
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1))


MAX_AUTOTUNED_SHAPES = 8
# Break-even of autotuning, estimated from the one GPU figure we have (issue 33, H100, nano, 640 px, batch 16):
# ~10 s of timing per new shape, ~75 ms per steady step. If the tuned kernels save at most 10% of a step (an
# assumption: unmeasured, it is the usual size of the gap between cuDNN's heuristics and its fastest algorithm
# for these layers), 10 s comes back after 10 / 0.0075 ~ 1,300 steps at that shape; 1,500 leaves a margin.
# BCCD at 640 (13 steps per epoch, 100 epochs, 1,300 steps in all) then runs without it; COCO (7,300 steps per
# epoch) autotunes, and its first epoch carries at most ~5 x 10 s over ~9 minutes.
MIN_STEPS_PER_AUTOTUNED_SHAPE = 1500


def tune_process(device: torch.device) -> None:
    """The process-wide settings a training run, val, predict and benchmark want on ``device`` (the module
    docstring says why): the larger oneDNN kernel cache, and on the CPU freed memory kept in the heap. Call it
    before the first convolution. In a Python session (``detector.train(...)``, ``detector.val(...)``) the heap
    setting stays for the rest of the process.

    cuDNN autotuning is decided later, by :func:`autotune_convolutions`, once a run's input shapes are known.
    """
    enlarge_onednn_cache()
    if device.type == "cpu":
        hold_freed_memory()


def autotune_convolutions(device: torch.device, *, input_shapes: int, steps: int, policy: str = "auto") -> bool:
    """Set ``cudnn.benchmark`` for a CUDA run of ``steps`` training steps over ``input_shapes`` distinct shapes.

    ``policy`` "auto": on only with at most ``MAX_AUTOTUNED_SHAPES`` shapes and at least
    ``MIN_STEPS_PER_AUTOTUNED_SHAPE`` steps per shape (the module docstring says why); "on" / "off" force it.
    Returns whether it is on; off (and untouched) on any other device.
    """
    if policy not in BENCHMARK_CHOICES:
        raise ValueError(f"--cudnn-benchmark must be one of {', '.join(BENCHMARK_CHOICES)} (got {policy!r})")
    if device.type != "cuda":
        return False
    if policy == "auto":
        enabled = 0 < input_shapes <= MAX_AUTOTUNED_SHAPES and steps >= MIN_STEPS_PER_AUTOTUNED_SHAPE * input_shapes
    else:
        enabled = policy == "on"
    torch.backends.cudnn.benchmark = enabled
    return enabled


@contextmanager
def cudnn_heuristics(device: torch.device, *, when: bool = True) -> Iterator[None]:
    """cuDNN's heuristics, not its autotuning, inside the block on CUDA (when ``when``); restored on exit.

    For work whose input shapes the run's steps never repeat: autotuning would time every convolution's
    algorithms for each of them (forward and both backward passes when it trains) and never use the answer.
    """
    before = torch.backends.cudnn.benchmark
    if device.type == "cuda" and when:
        torch.backends.cudnn.benchmark = False
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = before


def heuristics_over_many_shapes(device: torch.device, shapes: int, policy: str = "auto") -> AbstractContextManager:
    """:func:`cudnn_heuristics` for a block that runs more than ``MAX_AUTOTUNED_SHAPES`` input shapes (rectangular
    validation batches of varied data: each new shape would be timed once, per dtype); elsewhere, and when
    ``--cudnn-benchmark on`` forces autotuning, the setting is left as it is."""
    return cudnn_heuristics(device, when=shapes > MAX_AUTOTUNED_SHAPES and policy == "auto")
