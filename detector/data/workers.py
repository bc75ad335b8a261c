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


def _lower_priority(_worker_id: int) -> None:
    os.nice(LOWEST_PRIORITY)  # a raise past the ceiling is clamped to it, never an error


def worker_init(*, shares_cores_with_compute: bool) -> Callable[[int], None] | None:
    """The DataLoader ``worker_init_fn``: lowest priority when the model computes on these cores (the CPU)."""
    return _lower_priority if shares_cores_with_compute and hasattr(os, "nice") else None
