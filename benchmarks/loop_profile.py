"""Where the training loop's time goes, beside its step alone: host and GPU time per part of a steady epoch.

On an H100 the default loop ran at 0.71 of its step alone while waiting for data only 5-10% of each epoch
(docs/gpu.md), so the difference is the loop's own work: the batch's upload and the augmentation on the device
(the copy is queued one step ahead on its own stream, inside ``loader``; ``upload`` is the step's stream made to
wait for it; ``step_input``), the step, and the Python between them. This trains a short run with the trainer's
defaults and profiles its last epoch (``torch.profiler``; graphs are captured by then), with each step's parts
marked. Per step it prints the wall time, the host's time in each part, and on CUDA the GPU's time in each part
and its busy share of the epoch (the union of its kernels' intervals: a GPU idle while the host is busy means the
loop is host-bound), then the top GPU kernels. Its first GPU run (the second H100 lease) found the loop bound by
the GPU: busy 91% of the epoch, the step input's PyTorch ops 9.8 ms a step of it.

    python benchmarks/loop_profile.py --device cuda --imgsz 640 --batch 64 --data /tmp/shapes4096/shapes.yaml
    python benchmarks/loop_profile.py --epochs 2 --imgsz 160                  # the CPU: host times only
"""

from __future__ import annotations

import argparse
import tempfile
import time

import checkout  # noqa: F401 - first: this checkout's detector, installed or not
import torch
from torch.profiler import ProfilerActivity, profile, record_function

import detector.training.engine as engine
import detector.training.feed as feed
import detector.training.trainer as trainer_module
from detector.training.config import TrainConfig

PARTS = ("loader", "upload", "step_input", "step", "optimizer")  # marked ranges; the rest of each step is "other"
# Each part the loop calls by its module-level name (looked up at call time, so replacing it marks it); the loader's
# part is marked around the loop's next(). handed_over is called by feed.uploaded_ahead on CUDA only.
MARKED = ((engine, "step_input", "step_input"), (feed, "handed_over", "upload"), (engine, "graphed_step", "step"),
          (engine, "optimizer_step", "optimizer"))


def marked(name: str, function):
    """``function`` run inside a profiler range named ``name`` (a no-op range outside a profile)."""

    def wrapper(*args, **kwargs):
        with record_function(name):
            return function(*args, **kwargs)

    return wrapper


def union_ms(intervals: list[tuple[float, float]]) -> float:
    """Milliseconds covered by at least one of ``intervals`` (microsecond pairs): the GPU's busy time."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total / 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="", help="data YAML (default: the built-in shapes dataset)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--imgsz", type=int, default=320)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=3, help="the last one is profiled")
    parser.add_argument("--close-mosaic", type=int, default=None,
                        help="close-mosaic epochs (default: the trainer's 10, so all 3 epochs train without mosaic, "
                             "at imgsz); 0: mosaic and multi-scale, as most epochs of a long run")
    parser.add_argument("--workers", type=int, default=-1)
    parser.add_argument("--top", type=int, default=12, help="GPU kernels listed")
    args = parser.parse_args()
    if not args.data:
        from detector.data.synthetic import generate_shapes

        args.data = str(generate_shapes())
    cuda = torch.device(args.device).type == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]

    for module, name, part in MARKED:
        setattr(module, name, marked(part, getattr(module, name)))
    real_timed, real_epoch = engine.timed, trainer_module.train_one_epoch

    def timed(batches, waited):
        iterator = real_timed(batches, waited)
        while True:
            with record_function("loader"):
                batch = next(iterator, None)
            if batch is None:
                return
            yield batch

    engine.timed = timed
    profiled: dict = {}

    def train_one_epoch(step, loader, *, epoch, **kwargs):
        if epoch < args.epochs - 1:
            return real_epoch(step, loader, epoch=epoch, **kwargs)
        with profile(activities=activities) as prof:
            start = time.perf_counter()
            stats = real_epoch(step, loader, epoch=epoch, **kwargs)
            if cuda:
                torch.cuda.synchronize()
            profiled.update(wall=time.perf_counter() - start, steps=len(loader), prof=prof)
        return stats

    trainer_module.train_one_epoch = train_one_epoch
    with tempfile.TemporaryDirectory() as project:
        config = TrainConfig(data=args.data, device=args.device, imgsz=args.imgsz, batch=args.batch,
                             epochs=args.epochs, workers=args.workers, project=project, name="profile", plots=False,
                             val_interval=args.epochs,
                             **({} if args.close_mosaic is None else {"close_mosaic": args.close_mosaic}))
        trainer_module.train(config, progress=False)
    report(profiled, cuda=cuda, top=args.top, settings=args)
    return 0


def report(profiled: dict, *, cuda: bool, top: int, settings: argparse.Namespace) -> None:
    prof, steps, wall_ms = profiled["prof"], profiled["steps"], 1000 * profiled["wall"]
    events = prof.events()
    host = {part: 0.0 for part in PARTS}
    ranges: dict[str, list[tuple[float, float]]] = {part: [] for part in PARTS}
    kernels: list[tuple[float, float]] = []
    for event in events:
        if event.name in host and event.device_type == torch.autograd.DeviceType.CPU:
            host[event.name] += event.cpu_time_total / 1000
            ranges[event.name].append((event.time_range.start, event.time_range.end))
    if cuda:
        kernels = [(e.time_range.start, e.time_range.end) for e in events
                   if e.device_type == torch.autograd.DeviceType.CUDA]
    print(f"\nlast epoch of {settings.epochs}: {steps} steps, imgsz {settings.imgsz}, batch {settings.batch}, "
          f"device {settings.device}, data {settings.data}\n")
    print(f"wall {wall_ms / steps:.2f} ms per step ({steps * settings.batch / profiled['wall']:.1f} images/s)")
    print("\n| part | host ms per step | share of wall |\n|---|---:|---:|")
    for part in PARTS:
        print(f"| {part} | {host[part] / steps:.2f} | {host[part] / wall_ms:.0%} |")
    other = wall_ms - sum(host.values())
    print(f"| other (eager forward and backward when not graphed; the loop's Python) | {other / steps:.2f} | "
          f"{other / wall_ms:.0%} |")
    if not cuda:
        return
    averages = prof.key_averages()
    device_ms = {a.key: getattr(a, "device_time_total", getattr(a, "cuda_time_total", 0.0)) / 1000 for a in averages}
    busy = union_ms(kernels)
    print(f"\nGPU busy {busy / steps:.2f} ms per step: {busy / wall_ms:.0%} of the epoch's wall "
          "(kernels' intervals, overlaps counted once)")
    print("\n| part | GPU ms per step (kernels it launched) |\n|---|---:|")
    for part in PARTS:
        print(f"| {part} | {device_ms.get(part, 0.0) / steps:.2f} |")
    sort = "self_device_time_total" if hasattr(averages[0], "self_device_time_total") else "self_cuda_time_total"
    print(f"\nTop {top} operators by GPU time (whole epoch):\n{averages.table(sort_by=sort, row_limit=top)}")


if __name__ == "__main__":
    raise SystemExit(main())
