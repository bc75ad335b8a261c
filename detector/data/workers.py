"""How data-loading worker processes behave beside the process that trains: they yield the CPU and leave Ctrl-C and
SIGTERM to it.

On a CPU-only machine the step's compute threads (oneDNN/OpenMP) use every core. Loader workers at normal
priority preempt them mid-operation, and the other compute threads then wait at the next barrier: on 2 cores,
training with 2 workers ran ~13% slower than with none. Workers at the lowest priority run in the gaps
instead (Python between operations, waits), and when the queue of ready batches runs dry the main process
blocks on it, which hands the workers the whole CPU: they cannot starve.

A terminal's Ctrl-C goes to every process of the foreground group, workers included. Their parent decides
what a Ctrl-C means (the trainer finishes the epoch and saves, issue 23), so workers ignore it: a forked
worker would otherwise run the parent's Python handler (printing its "Ctrl-C: ..." line once per worker)
or raise KeyboardInterrupt mid-batch. Every loader's ``worker_init_fn`` installs this, so it holds
whatever the order in which loaders (and their workers) start relative to the parent's handler. A SIGTERM to the
whole group (torchrun's, SLURM's) is the parent's to act on too; a SIGTERM from the parent still ends a worker
(:func:`detector.forked.end_at_parents_sigterm_only`).
"""

from __future__ import annotations

import functools
import math
import os
import signal
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch.utils.data import DataLoader, get_worker_info

from detector.forked import end_at_parents_sigterm_only
from detector.tuning import hold_freed_memory

LOWEST_PRIORITY = 19  # the niceness ceiling on Linux and macOS
CPU_TRAINING_WORKERS = 2  # measured on 2 cores: the model, not the data, is the wall there (docs/benchmarks.md)
PREFETCH_FACTOR = 2  # batches a worker may have ready ahead of the main process (torch's default, said explicitly)
MAX_GPU_WORKERS = 16  # each worker holds its own decode buffers; beyond this the GPU is fed already


def batch_tensor(shape: Sequence[int], dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """An uninitialised tensor for a collated batch: in shared memory when made in a loader worker.

    A worker hands its batch to the main process through shared memory, and pickling a tensor that is not there
    copies it there first: a second pass over every byte of every batch, each page faulted in twice. Made there to
    begin with (as PyTorch's own ``default_collate`` does), the batch travels without that copy.
    """
    if get_worker_info() is None:
        return torch.empty(tuple(shape), dtype=dtype)
    return shared_tensor(shape, dtype)


class Release(NamedTuple):
    """What frees a :class:`BatchPool` batch (:func:`release`): its pool's shared flags, the worker and the slot."""

    flags: torch.Tensor
    worker: int
    slot: int


class BatchPool:
    """A loader worker's shared-memory buffers for collated batches, each used again once its consumer is done.

    A buffer made afresh for every batch has every page faulted in and zeroed by the kernel before the worker's
    first write: shared memory gets no huge pages, and that first touch cost ~8x a write to memory touched before
    (100 MB: 91 against 11 ms on a 2-core EPYC), more than the rest of a mosaic item's work. So each worker keeps
    ``slots`` buffers and a shared byte per slot: 1 while the main process holds the slot's batch, set back to 0
    by :func:`release` when the consumer has copied it out (the DataLoader's pin thread, on CUDA, before the batch
    reaches the loop). A worker has at most ``prefetch_factor`` batches that the loop has not received, the one it
    is making among them (the DataLoader sends it a new index only once the loop has received one, which the pin
    thread frees before handing it on), so ``prefetch_factor`` slots do not run out in steady state; when they do
    (a consumer that frees later, or never), the batch gets a buffer of its own, as without a pool: slower, never
    wrong. The memory held is what the batches in flight took before (``prefetch_factor`` per worker), with
    ``GROWTH``.

    Measured on a 2-core AMD EPYC (AVX2), 640 px, batch 64, mosaic, RAM cache, each batch copied out as the pin
    thread does (``python benchmarks/data_speed.py --pixel-augment device --imgsz 640 --batch 64 --caches ram
    --copy-out``): 1 worker 250 -> 468 images/s, 2 workers 361 -> 731.
    """

    GROWTH = 1.25  # a slot grows to this much more than asked, so that the next, slightly larger batch fits

    def __init__(self, slots: int, worker: int = 0) -> None:
        self.worker = worker  # the loader's worker id: its successor (a new epoch without persistent workers) reuses it
        self.flags = shared_tensor((slots,), torch.uint8)
        self.flags.zero_()
        self._storages: list[torch.UntypedStorage | None] = [None] * slots

    def tensor(self, shape: Sequence[int], dtype: torch.dtype = torch.uint8) -> tuple[torch.Tensor, Release | None]:
        """An uninitialised shared tensor of ``shape`` and what frees it: None when every slot is taken."""
        size = math.prod(shape) * dtype.itemsize
        free = [slot for slot, flag in enumerate(self.flags.tolist()) if flag == 0]
        if not free:
            return shared_tensor(shape, dtype), None
        capacity = [0 if storage is None else storage.nbytes() for storage in self._storages]
        fitting = [slot for slot in free if capacity[slot] >= size]
        # the smallest buffer that fits; else the smallest free one grows (the larger ones still fit more batches)
        slot = min(fitting or free, key=lambda s: capacity[s])
        if not fitting:
            self._storages[slot] = None  # the old buffer's memory goes before the new one is made
            self._storages[slot] = torch.UntypedStorage._new_shared(int(size * self.GROWTH))
        self.flags[slot] = 1
        tensor = torch.empty(0, dtype=dtype).set_(self._storages[slot], 0, tuple(shape))  # type: ignore[arg-type]
        return tensor, Release(self.flags, self.worker, slot)


# In the process that consumes pooled batches: each worker slot's buffer, kept mapped (with its worker's flags). A
# worker sends a buffer as a file descriptor, and torch maps it afresh unless it still holds a mapping of that file
# (torch.multiprocessing's shared_cache): every page of a new mapping faults again on the consumer's first read. Kept,
# a batch copies out in 0.16 instead of 0.27 ms a MB (2-core EPYC, 640-px mosaic batches of 64). Keyed by worker id
# and slot, so bounded by workers x slots: a grown buffer, or a new worker of the same id (a loader without persistent
# workers starts new ones every epoch), replaces its slot's. Dropped when the workers stop (stop_workers).
_MAPPED: dict[tuple[int, int], tuple[torch.Tensor, torch.UntypedStorage]] = {}


def release(ticket: Release | None, pixels: torch.Tensor | None = None) -> None:
    """The consumer is done with a :class:`BatchPool` batch: its worker may write the buffer again. ``pixels``, the
    batch's tensor in that buffer: its mapping is kept for the slot's next batch. Call it once per ticket: the
    slot's next batch has the same ticket."""
    if ticket is not None:
        if pixels is not None:
            _MAPPED[(ticket.worker, ticket.slot)] = (ticket.flags, pixels.untyped_storage())
        ticket.flags[ticket.slot] = 0


def forget_mapped() -> None:
    """Drop the mappings :func:`release` kept (the workers whose buffers they are have stopped, or are stopping)."""
    _MAPPED.clear()


_POOL: BatchPool | None = None  # this worker's, made by worker_init where its loader frees batches


def pooled_batch_tensor(shape: Sequence[int], dtype: torch.dtype = torch.uint8) -> tuple[torch.Tensor, Release | None]:
    """:func:`batch_tensor`, from this worker's :class:`BatchPool` where its loader set one up (``worker_init``'s
    ``pool_slots``): then the caller must hand the returned ticket to whoever copies the batch out, who calls
    :func:`release`. Elsewhere (no pool, the main process) the ticket is None."""
    if _POOL is None or get_worker_info() is None:
        return batch_tensor(shape, dtype), None
    return _POOL.tensor(shape, dtype)


def shared_tensor(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    storage = torch.UntypedStorage._new_shared(math.prod(shape) * dtype.itemsize)
    return torch.empty(0, dtype=dtype).set_(storage, 0, tuple(shape))


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity: a container's or torchrun's share), at least 1."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def capped_workers(asked: int, *, processes_per_node: int = 1, cores: int | None = None) -> int:
    """``asked`` loader workers, at most the cores each process of this node may claim (at least 1), as Ultralytics
    caps its ``workers=``: its default of 8, which every args.yaml carries, on a 2-core machine made 8 processes
    take turns on 2 cores beside the model, and PyTorch warned at every loader built."""
    if cores is None:
        cores = usable_cores()
    return min(asked, max(1, cores // max(processes_per_node, 1)))


def default_workers(device_type: str, *, processes_per_node: int = 1, cores: int | None = None) -> int:
    """Loader workers for ``--workers -1`` (auto).

    On the CPU the model computes on the same cores, so a small fixed number. On a GPU the workers are what
    feeds it (issue 16: both trainers stalled at ~550-590 images/s on an H100 with 8 workers), so every core
    this process can claim on its node, less one for the main process, up to ``MAX_GPU_WORKERS``.
    """
    if device_type != "cuda":
        return CPU_TRAINING_WORKERS
    if cores is None:
        cores = usable_cores()
    return max(1, min(MAX_GPU_WORKERS, cores // max(processes_per_node, 1) - 1))


def _init_worker(worker_id: int, *, lower_priority: bool, pool_slots: int) -> None:
    global _POOL
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what a Ctrl-C means (module docstring)
    end_at_parents_sigterm_only(os.getppid())  # and what a SIGTERM to the process group means
    if lower_priority:
        os.nice(LOWEST_PRIORITY)  # a raise past the ceiling is clamped to it, never an error
    # Each item's mosaic region (1.6 MB at 640 px, its size changing from item to item) and each batch's buffers
    # come and go: by default glibc maps some afresh and returns freed memory to the kernel, and their pages fault
    # in again (1.6 MB blocks: 384 faults per 50 allocations by default, 5 held). Held in the heap, they are
    # reused (a CPU run's workers inherit this from their parent; a GPU run's parent does not hold its own memory).
    hold_freed_memory()
    _POOL = BatchPool(pool_slots, worker=worker_id) if pool_slots else None


def worker_init(*, shares_cores_with_compute: bool, pool_slots: int = 0) -> Callable[[int], None]:
    """The DataLoader ``worker_init_fn``: ignore SIGINT, and SIGTERM but the parent's; lowest priority when the
    model computes on these cores; freed memory kept in the worker's heap (:func:`detector.tuning.hold_freed_memory`);
    with ``pool_slots``, a :class:`BatchPool` of that many buffers for the batches whose consumer releases them (the
    training loader's on CUDA: its pin thread copies every batch out).

    A ``functools.partial`` of a module-level function, so it pickles for the spawn start method too.
    """
    return functools.partial(_init_worker, lower_priority=shares_cores_with_compute and hasattr(os, "nice"),
                             pool_slots=pool_slots)


def stop_workers(loader: DataLoader | None) -> None:
    """Stop ``loader``'s persistent workers now, as dropping the loader's last reference would.

    A loader with ``persistent_workers`` keeps its iterator, and with it its worker processes, for as long as the
    loader lives: a run's, to the end of its command. Left to the process's exit, a loader that also pins memory
    (every CUDA run's) costs 5 s per worker in torch 2.11, the GPU image's: for such a loader torch registers an
    exit hook per worker that waits up to 5 s for it to end, and at exit nothing tells it to (pytorch/pytorch#81794;
    the pinned torch 2.14 shuts the iterator down at exit instead). Measured on an H100 (docs/gpu.md): 40 s after
    the last line of a run with 8 workers, 76 s with 15. Stopped here, the workers are told to end and joined at
    once, and those exit hooks find them gone.
    """
    iterator = getattr(loader, "_iterator", None)  # torch's own attribute for the persistent iterator
    if loader is None or iterator is None:
        return
    loader._iterator = None  # type: ignore[attr-defined]
    shutdown = getattr(iterator, "_shutdown_workers", None)  # what the iterator's __del__ calls
    if shutdown is not None:
        shutdown()  # joins the pin thread too: until then it may release, and so map, a batch
    if pools_batches(loader):  # a run has one such loader (the training loader on CUDA)
        forget_mapped()


def pools_batches(loader: DataLoader) -> bool:
    """Whether ``loader``'s workers keep a :class:`BatchPool` (``worker_init``'s ``pool_slots``)."""
    keywords = getattr(loader.worker_init_fn, "keywords", None) or {}
    return keywords.get("pool_slots", 0) > 0
