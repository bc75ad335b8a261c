"""Does a ``non_blocking`` copy of a small pageable host tensor wait for the GPU's queued work?

The training step copies a few small host tensors each step with ``non_blocking=True`` (the padded targets,
``detector/loss.py``; the pixel-op parameters, ``detector/data/batch_augment.py``; a CUDA graph's static batch,
``detector/training/cuda_graph.py``). From pinned memory such a copy is queued and the host goes on; from pageable
memory "the driver may synchronize with the stream" (CUDA's API synchronisation notes), which would make each step
wait for the previous one and keep the host from running ahead. Which one this GPU and driver do decides whether
those tensors need pinned buffers. This prints, per source, how long the copy held the host while about
``--busy-ms`` of matrix products were queued::

    python benchmarks/pageable_copy.py --device cuda

A copy that holds the host for most of the queued time waited for it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch


def queue_work(matrix: torch.Tensor, products: int) -> None:
    for _ in range(products):
        matrix @ matrix


def held_ms(source: torch.Tensor, device: torch.device, matrix: torch.Tensor, products: int) -> float:
    """Milliseconds the host spends in ``source.to(device, non_blocking=True)`` with ``products`` queued."""
    torch.cuda.synchronize(device)
    queue_work(matrix, products)
    start = time.perf_counter()
    source.to(device, non_blocking=True)
    held = time.perf_counter() - start
    torch.cuda.synchronize(device)
    return 1000 * held


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--busy-ms", type=float, default=200.0, help="GPU work queued before each copy")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type != "cuda" or not torch.cuda.is_available():
        print("pageable_copy: needs a CUDA device", file=sys.stderr)
        return 1
    matrix = torch.randn(4096, 4096, device=device)
    queue_work(matrix, 3)
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    queue_work(matrix, 10)
    torch.cuda.synchronize(device)
    products = max(1, round(args.busy_ms / (100 * (time.perf_counter() - start))))
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    queue_work(matrix, products)
    torch.cuda.synchronize(device)
    busy = 1000 * (time.perf_counter() - start)
    targets = torch.zeros(16, 64, 5)  # a batch of 16 padded to 64 boxes: the loss's padded targets
    print(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}: {busy:.0f} ms of GPU work queued")
    print("| source | host held by the copy, ms (median) |\n|---|---:|")
    for name, source in (("pageable", targets), ("pinned", targets.pin_memory())):
        times = [held_ms(source, device, matrix, products) for _ in range(args.repeats)]
        print(f"| {name} | {statistics.median(times):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
