"""What a checkpoint costs the training thread: the snapshot (every tensor copied to the CPU) against the write.

The trainer snapshots on the training thread and a writer thread writes (detector/training/checkpoint_writer.py);
this times both for a model scale, with AdamW state after one step, as ``run_checkpoint`` builds it, each repeated;
and what an improved epoch pays when last.pt is not due (its stripped snapshot, held as best.pt), and the write's
finiteness check.

    python benchmarks/checkpoint_speed.py                 # nano on the CPU
    python benchmarks/checkpoint_speed.py --device cuda   # the copy from GPU memory (unmeasured here: no GPU)
"""

from __future__ import annotations

import checkout  # noqa: F401 - first: this checkout's detector, installed or not
import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from detector.checkpoint import RunState, Trained, run_checkpoint, save_checkpoint, strip_checkpoint
from detector.checkpoint_integrity import all_finite
from detector.model import build_model
from detector.training.checkpoint_writer import snapshot, stripped_snapshot


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="n")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    device = torch.device(args.device)
    model = build_model(num_classes=80, scale=args.model).to(device)
    ema = build_model(num_classes=80, scale=args.model).to(device)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.rand(1, 3, 64, 64, device=device))[0].sum().backward()
    optimizer.step()
    trained = Trained(model, ema, optimizer, torch.amp.GradScaler(enabled=False))
    state = RunState(epoch=0, config={}, names=[str(i) for i in range(80)], precision="fp32")
    times: dict[str, list[float]] = {"snapshot (training thread)": [], "write last.pt (writer thread)": [],
                                     "strip + write best.pt (writer thread)": [],
                                     "held best.pt: stripped snapshot (training thread)": [],
                                     "all_finite of the weights (each write)": []}
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(args.repeats):
            start = time.perf_counter()
            payload = snapshot(run_checkpoint(trained, state))
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times["snapshot (training thread)"].append(time.perf_counter() - start)
            start = time.perf_counter()
            save_checkpoint(payload, Path(folder) / "last.pt")
            times["write last.pt (writer thread)"].append(time.perf_counter() - start)
            start = time.perf_counter()
            save_checkpoint(strip_checkpoint(payload), Path(folder) / "best.pt")
            times["strip + write best.pt (writer thread)"].append(time.perf_counter() - start)
            start = time.perf_counter()
            stripped_snapshot(run_checkpoint(trained, state))
            times["held best.pt: stripped snapshot (training thread)"].append(time.perf_counter() - start)
            start = time.perf_counter()
            all_finite(payload["model"])
            times["all_finite of the weights (each write)"].append(time.perf_counter() - start)
        size = (Path(folder) / "last.pt").stat().st_size
    print(f"YOLO-{args.model} on {device}, last.pt {size / 2**20:.1f} MiB, {args.repeats} repeats\n")
    print("| step | ms, median (range) |\n|---|---|")
    for name, values in times.items():
        print(f"| {name} | {1000 * statistics.median(values):.1f} ({1000 * min(values):.1f}-{1000 * max(values):.1f}) |")


if __name__ == "__main__":
    main()
