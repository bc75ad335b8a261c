"""Page-locked copies of a loader's batches, made on several threads.

On CUDA the DataLoader's pin thread copies every batch out of its worker's shared memory into page-locked memory,
from which the upload to the GPU runs asynchronously. PyTorch sets that thread to one intra-op thread, so the copy
runs at one core's copy rate: 127 MB (a mosaic batch's atlas at 640 px, batch 64) took 24-25 ms on one thread of a
2-core Xeon against 14 ms on two (``python benchmarks/pin_copy.py``). An H100's step alone ran at ~1,800-2,100
images/s, ~30 such batches a second: one thread near its whole time on this copy alone, and the loop waits on the
pin thread whenever it falls behind. So a large batch is copied in slices, one per thread of a small pool, the
pin thread copying the first; each slice is one ``copy_`` (which releases the GIL) on its own thread.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait

import torch

from detector.data.workers import usable_cores

# Below this a copy stays on one thread: a slice's hand-off costs tens of microseconds, and a small copy is that fast.
MIN_PARALLEL_BYTES = 8 << 20
MAX_COPY_THREADS = 4  # a memory copy stops scaling at a few threads (memory bandwidth); the workers need the cores
COPY_THREADS: int | None = None  # None: copy_threads(); a benchmark sets 1 to time the single-threaded copy


def copy_threads(cores: int | None = None) -> int:
    """Threads for one batch's copy: a quarter of the process's cores, 1 to :data:`MAX_COPY_THREADS` (16 cores: 4).

    The rest stay with the loader workers (8 by default on a 16-core GPU host) and the training thread."""
    return max(1, min(MAX_COPY_THREADS, (usable_cores() if cores is None else cores) // 4))


_pool: ThreadPoolExecutor | None = None
_pool_pid = -1
_pool_lock = threading.Lock()


def _copier() -> ThreadPoolExecutor:
    """The process's copy threads, made on first use (a forked child makes its own: the parent's threads are not in
    it)."""
    global _pool, _pool_pid
    with _pool_lock:
        if _pool is None or _pool_pid != os.getpid():
            # One intra-op thread each, as PyTorch sets its pin thread: a thread otherwise takes the setting in force
            # at its first operation, and a slice copied on every core by each of 4 threads oversubscribes them.
            _pool = ThreadPoolExecutor(MAX_COPY_THREADS - 1, thread_name_prefix="detector-pin-copy",
                                       initializer=torch.set_num_threads, initargs=(1,))
            _pool_pid = os.getpid()
        return _pool


def copy_in_slices(destination: torch.Tensor, source: torch.Tensor, threads: int) -> None:
    """``destination.copy_(source)`` for two contiguous tensors of one shape and dtype, in up to ``threads`` slices
    copied at once (the calling thread copies the first). Others (strided, small, one thread) take one ``copy_``."""
    size = source.numel() * source.element_size()
    if (threads <= 1 or size < MIN_PARALLEL_BYTES or not source.is_contiguous() or not destination.is_contiguous()
            or source.dtype != destination.dtype or source.shape != destination.shape):
        destination.copy_(source)
        return
    threads = min(threads, MAX_COPY_THREADS)
    into, out_of = destination.view(-1), source.view(-1)
    bounds = [out_of.numel() * i // threads for i in range(threads + 1)]
    slices = [(into[start:end], out_of[start:end]) for start, end in zip(bounds, bounds[1:])]
    others = [_copier().submit(torch.Tensor.copy_, to, part) for to, part in slices[1:]]
    try:
        slices[0][0].copy_(slices[0][1])
    finally:
        wait(others)  # every slice done before the caller may free or reuse either tensor
    for copied in others:
        copied.result()  # re-raises a slice's error here


def pinned_copy(source: torch.Tensor, *, threads: int | None = None, pin: bool = True) -> torch.Tensor:
    """A contiguous copy of ``source`` in page-locked memory (PyTorch's cached page-locked allocator, as
    ``Tensor.pin_memory``), copied on ``threads`` threads (when None, :data:`COPY_THREADS` or else
    :func:`copy_threads`). ``pin=False`` makes the same copy in ordinary memory (what the CPU tests check)."""
    destination = torch.empty(source.shape, dtype=source.dtype, pin_memory=pin)
    if threads is None:
        threads = COPY_THREADS if COPY_THREADS is not None else copy_threads()
    copy_in_slices(destination, source, threads)
    return destination
