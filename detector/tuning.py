"""Process-wide settings for fast training.

oneDNN kernel cache (set when a run starts: by :func:`tune_for_training`, and by every other command first
thing). oneDNN, which runs PyTorch's CPU convolutions, keeps its compiled kernels ("primitives") in a cache
keyed by shape, 1024 entries by default. Multi-scale training cycles about 11 input sizes through ~65
convolutions, each with a forward, a backward-data and a backward-weights kernel: over 2,000 keys, so the
default cache thrashes and every size change rebuilds its kernels. Measured on a 2-core AVX-512 CPU, a bare
BF16 training step cycling the sizes ran at 27.7 images/s with the default (the same as with the cache off)
and ~31-33 with room for every kernel; resident memory did not grow.

Freed memory (set by the trainer when it computes on the CPU). glibc serves allocations over its mmap
threshold (at most 32 MB) with fresh mappings and returns them on free, and trims the heap top on free, so
every training step asks the kernel for zeroed pages again for the same activations: a million minor page
faults per 44 FP32 steps. Keeping freed memory in the heap removes them; measured on the same CPU, bare
multi-scale steps ran ~11% faster in FP32 and BF16, whole training runs 2-4% faster, with peak resident
memory about 4% higher.

cuDNN autotuning (set by the trainer on CUDA, once it knows the run's input shapes). With
``cudnn.benchmark`` cuDNN times its algorithms for every convolution, forward and backward, the first time
each input shape appears, and keeps the fastest. The timing is paid once per shape, the gain on every
later step, so it pays when a run sees few shapes many times. Issue 16 measured the cost on an H100: with
per-batch multi-scale over 21 sizes plus a partial last batch, epochs of ~1 s took 5-27 s whenever a new
(batch, size) shape appeared, a tax that ran through the whole run. :mod:`detector.training.multiscale` now bounds
the shapes (default: 3 at 320 px, 5 at 640 px, one batch size), so autotuning stays on up to
``MAX_AUTOTUNED_SHAPES`` shapes and is off beyond (as detectron2 and torchvision do when sizes vary):
then cuDNN's heuristics pick an algorithm with no timing. The limit is a judgement, not a measurement:
GPU timings were not measured on the development machine (no GPU). ``cudnn.benchmark_limit`` (algorithms
tried per shape) is left at PyTorch's default.
"""

from __future__ import annotations

import ctypes
import os
import platform

import torch

ONEDNN_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
ONEDNN_CACHE_CAPACITY = 8192


def enlarge_onednn_cache(capacity: int = ONEDNN_CACHE_CAPACITY) -> None:
    """Ask oneDNN for a larger kernel cache, unless the user already chose a size.

    oneDNN reads the variable when it first builds a kernel, so this must run before the first convolution
    of the process: :func:`tune_for_training` and the other commands call it first thing. Importing
    ``detector`` changes nothing in the environment.
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


def tune_for_training(device: torch.device) -> None:
    """The process-wide settings a training run on ``device`` wants (the module docstring says why).

    cuDNN autotuning is decided later, by :func:`autotune_convolutions`, once the input shapes are known.
    """
    enlarge_onednn_cache()
    if device.type == "cpu":
        hold_freed_memory()


def autotune_convolutions(device: torch.device, *, input_shapes: int) -> bool:
    """Turn ``cudnn.benchmark`` on for a CUDA run with at most ``MAX_AUTOTUNED_SHAPES`` input shapes.

    Returns whether it is on; off (and untouched) elsewhere. The module docstring says why.
    """
    if device.type != "cuda":
        return False
    torch.backends.cudnn.benchmark = input_shapes <= MAX_AUTOTUNED_SHAPES
    return torch.backends.cudnn.benchmark
