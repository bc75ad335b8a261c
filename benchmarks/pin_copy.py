"""The pin thread's copy of one batch out of a worker's shared memory, on 1 to N threads.

On CUDA the DataLoader's pin thread (one intra-op thread, PyTorch's setting) copies each batch into page-locked
memory; ``detector.data.pinned`` slices the device path's atlas over a few threads. This times that copy as the pin
thread makes it: from a thread set to one intra-op thread, out of shared memory already mapped (the training loader
keeps its workers' buffers mapped), into PyTorch's cached page-locked memory on CUDA (``Tensor.pin_memory`` for one
thread, as before) or a reused ordinary buffer without CUDA::

    python benchmarks/pin_copy.py                 # 127 MB: a mosaic atlas at 640 px, batch 64
    python benchmarks/pin_copy.py --mb 60 --threads 1 2 4

Prints the median of ``--repeats`` copies per thread count and the GB/s it makes.
"""

from __future__ import annotations

import checkout  # noqa: F401 - first: this checkout's detector, installed or not
import argparse
import statistics
import sys
import threading
import time

import torch

from detector.data.pinned import copy_in_slices, copy_threads, pinned_copy


def time_copies(source: torch.Tensor, threads: int, repeats: int, pin: bool) -> float:
    """Median milliseconds of one copy of ``source`` on ``threads`` threads, timed in a one-intra-op-thread thread."""
    times: list[float] = []

    def run() -> None:
        torch.set_num_threads(1)  # the DataLoader's pin thread's setting
        reused = None if pin else torch.empty_like(source)
        for _ in range(repeats + 1):  # the first fills the page-locked cache (or faults the buffer in)
            start = time.perf_counter()
            if pin and threads == 1:
                source.pin_memory()
            elif pin:
                pinned_copy(source, threads=threads)
            else:
                copy_in_slices(reused, source, threads)
            times.append(time.perf_counter() - start)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return 1000 * statistics.median(times[1:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=127.0, help="the batch's size in MB (default: 127)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    pin = torch.cuda.is_available()
    source = torch.randint(0, 256, (int(args.mb * 2**20),), dtype=torch.uint8).share_memory_()
    print(f"{args.mb:g} MB out of shared memory into {'page-locked' if pin else 'ordinary (no CUDA)'} memory; "
          f"training's pin thread uses {copy_threads()} thread(s) on this machine")
    print("| threads | ms | GB/s |\n|---:|---:|---:|")
    for threads in args.threads:
        milliseconds = time_copies(source, threads, args.repeats, pin)
        print(f"| {threads} | {milliseconds:.1f} | {args.mb * 2**20 / milliseconds / 1e6:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
