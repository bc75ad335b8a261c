"""Process-wide settings of the kernel libraries and the C heap, applied when a run or a command starts.

- oneDNN kernel cache (every command, first thing): multi-scale training cycles its input sizes through ~65
  convolutions x 3 kernels each, over oneDNN's default 1024-entry cache, so every size change rebuilt its
  kernels. With room for all of them a bare multi-scale step ran ~10% faster on a 2-core CPU.
- Freed memory kept in the heap (training on the CPU): glibc handed large freed blocks back to the kernel, so
  every step faulted in fresh zeroed pages for the same activations; kept, bare steps ran ~11% faster, peak
  resident memory ~4% higher. Skipped when you tune malloc yourself, and off glibc.
- cuDNN autotuning (training on CUDA, once the run's input shapes are known): its timing is paid once per
  input shape, so it is on up to ``MAX_AUTOTUNED_SHAPES`` shapes and off beyond, where heuristics choose (as
  detectron2 and torchvision do when sizes vary). The limit is a judgement, not yet measured on a GPU.

The measurements behind each, with their commands: docs/benchmarks.md, "Where the CPU time goes", and
docs/multiscale.md, "cuDNN autotuning".
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
