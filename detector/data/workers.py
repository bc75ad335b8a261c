"""How data-loading worker processes share a CPU with a training step that runs on the same cores.

On a CPU-only machine the step's compute threads (oneDNN/OpenMP) use every core. Loader workers at normal
priority preempt them mid-operation, and the other compute threads then wait at the next barrier: on 2 cores,
training with 2 workers ran ~13% slower than with none. Workers at the lowest priority run in the gaps
instead (Python between operations, waits), and when the queue of ready batches runs dry the main process
blocks on it, which hands the workers the whole CPU: they cannot starve.
"""

from __future__ import annotations

import os
from collections.abc import Callable

LOWEST_PRIORITY = 19  # the niceness ceiling on Linux and macOS
CPU_TRAINING_WORKERS = 2  # measured on 2 cores: the model, not the data, is the wall there (docs/benchmarks.md)
MAX_GPU_WORKERS = 16  # each worker holds its own decode buffers; beyond this the GPU is fed already


def default_workers(device_type: str, *, processes_per_node: int = 1, cores: int | None = None) -> int:
    """Loader workers for ``--workers -1`` (auto).

    On the CPU the model computes on the same cores, so a small fixed number. On a GPU the workers are what
    feeds it (issue 16: both trainers stalled at ~550-590 images/s on an H100 with 8 workers), so every core
    this process can claim on its node, less one for the main process, up to ``MAX_GPU_WORKERS``.
    """
    if device_type != "cuda":
        return CPU_TRAINING_WORKERS
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(MAX_GPU_WORKERS, cores // max(processes_per_node, 1) - 1))


def _lower_priority(_worker_id: int) -> None:
    os.nice(LOWEST_PRIORITY)  # a raise past the ceiling is clamped to it, never an error


def worker_init(*, shares_cores_with_compute: bool) -> Callable[[int], None] | None:
    """The DataLoader ``worker_init_fn``: lowest priority when the model computes on these cores (the CPU)."""
    return _lower_priority if shares_cores_with_compute and hasattr(os, "nice") else None
