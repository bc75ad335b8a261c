"""Peak memory of one training step at each input size: what the largest multi-scale size costs.

Each size runs in a fresh process (peak resident memory is a per-process figure): the nano model, the
default precision and memory format, two forward + backward steps at ``--batch`` on random images with a
few boxes each. On a CPU the figure is peak RSS, a proxy of the activation memory that sets peak GPU
memory (activations grow with pixels: a 1.5x side costs ~2.25x); on CUDA it is peak allocated memory.

    python benchmarks/multiscale_memory.py --sizes 256,320,384,480 --batch 16
"""

from __future__ import annotations

import checkout  # noqa: F401 - first: this checkout's detector, installed or not
import argparse

from isolated import RESULT, run_isolated

STEP = f"""
import json, sys, torch
from detector.training.engine import peak_memory_mb
from detector.loss import DetectionLoss
from detector.model import build_model
from detector.precision import resolve_precision
args = json.loads(sys.argv[1])
torch.set_num_threads(args["threads"])
device = torch.device(args["device"])
model = build_model(num_classes=3).to(device).to(memory_format=torch.channels_last).train()
criterion = DetectionLoss.for_model(model).to(device)
precision = resolve_precision("auto", device)
batch, size = args["batch"], args["size"]
targets = torch.tensor([[i, i % 3, 0.5, 0.5, 0.2, 0.3] for i in range(batch)], device=device)
before = peak_memory_mb(device)
for _ in range(2):
    images = torch.rand(batch, 3, size, size, device=device).contiguous(memory_format=torch.channels_last)
    with precision.autocast():
        outputs = model(images)
    loss, _ = criterion(outputs, targets, images.shape[2:])
    loss.backward()
    model.zero_grad(set_to_none=True)
print("{RESULT}" + json.dumps({{"size": size, "peak_mb": peak_memory_mb(device), "before_mb": before}}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="256,320,384,480", help="comma-separated input sizes")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (memory does not depend on it)")
    args = parser.parse_args()
    rows = [run_isolated(STEP, {"size": int(size), "batch": args.batch, "device": args.device,
                                "threads": args.threads}) for size in args.sizes.split(",")]
    base = min(rows, key=lambda row: abs(row["size"] - 320))
    print("| size px | pixels vs 320 px | peak MB | step growth MB | growth vs 320 px |\n|---|---|---|---|---|")
    for row in rows:
        growth = row["peak_mb"] - row["before_mb"]
        print(f"| {row['size']} | {(row['size'] / base['size']) ** 2:.2f}x | {row['peak_mb']:.0f} | {growth:.0f} | "
              f"{growth / (base['peak_mb'] - base['before_mb']):.2f}x |")


if __name__ == "__main__":
    main()
