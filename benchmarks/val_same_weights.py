"""Validation time against Ultralytics on the same weights: each pass over the same split, same thresholds.

Comparing each trainer's own in-training validation mixes up two things: a better-trained model puts more boxes
above conf 0.001 into NMS and the COCO evaluation. Here one set of weights (an Ultralytics YOLOv8n checkpoint,
read into our model by ``detector.weights``) is validated by both: Ultralytics' ``model.val`` and our validation
loop as training's validator runs it (the BatchNorm-folded copy, rectangular batches, channels-last, kept loader),
also in square batches and without the fold.
Each side runs in its own process, ``--passes`` times (the first pass includes start-up: loaders, caches).

    python benchmarks/val_same_weights.py                               # built-in shapes, weights trained 1 epoch
    python benchmarks/val_same_weights.py --weights best.pt --data PATH/bccd.yaml --imgsz 640

Without ``--weights`` it trains Ultralytics' YOLOv8n for ``--train-epochs`` on the data first. Prints a markdown
table. Ultralytics (AGPL-3.0) is a benchmark extra: ``pip install ultralytics``.
"""

from __future__ import annotations

import checkout  # noqa: F401 - first: this checkout's detector, installed or not
import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from isolated import run_isolated
from train_speed import absolute_yaml

ULTRALYTICS_TRAIN = r"""
import json, sys
from ultralytics import YOLO
args = json.loads(sys.argv[1])
model = YOLO("yolov8n.yaml")
model.train(data=args["data"], epochs=args["epochs"], imgsz=args["imgsz"], batch=16, workers=2, device=args["device"],
            project=args["project"], name="ultralytics", exist_ok=True, plots=False, seed=0, val=False, verbose=False)
print("RESULT", json.dumps({"weights": str(model.trainer.last)}))
"""

ULTRALYTICS_VAL = r"""
import json, sys, time
from ultralytics import YOLO
args = json.loads(sys.argv[1])
model = YOLO(args["weights"])
seconds, score = [], None
for _ in range(args["passes"]):
    start = time.perf_counter()
    metrics = model.val(data=args["data"], imgsz=args["imgsz"], batch=args["batch"], device=args["device"],
                        plots=False, workers=2, verbose=False)
    seconds.append(time.perf_counter() - start)
    score = float(metrics.box.map)
print("RESULT", json.dumps({"seconds": seconds, "map": score}))
"""

OUR_VAL = r"""
import json, sys, time
import torch
from detector.data.build import build_split
from detector.data.spec import load_dataset_spec
from detector.inference.fusion import FusedCopy
from detector.inference.torch_backend import make_torch_infer
from detector.metrics.loop import make_val_loader, run_validation
from detector.model import build_model
from detector.postprocess import NMSConfig
from detector.precision import resolve_precision
from detector.training.validator import validation_dtype
from detector.tuning import enlarge_onednn_cache
from detector.weights import load_pretrained, read_ultralytics_checkpoint
args = json.loads(sys.argv[1])
enlarge_onednn_cache()  # as training does (detector/tuning.py)
spec = load_dataset_spec(args["data"])
checkpoint = read_ultralytics_checkpoint(args["weights"])
model = build_model(num_classes=len(spec.names), scale=checkpoint.scale, class_channels=checkpoint.class_channels)
load_pretrained(model, checkpoint)
device = torch.device(args["device"])
model.eval().to(device).to(memory_format=torch.channels_last)
precision = resolve_precision("auto", device)
split = build_split(spec, "val", image_size=args["imgsz"], augment=None, cache="none")
nms = NMSConfig(conf_threshold=0.001, iou_threshold=0.7, max_detections=300, multi_label=True)
result = {"precision": precision.name}
for name, fold, rect in (("as training", True, True), ("square", True, False), ("unfolded square", False, False)):
    loader = make_val_loader(split, batch_size=args["batch"], workers=2, cpu_compute=device.type == "cpu", rect=rect)
    net = FusedCopy(model, dtype=validation_dtype(precision), channels_last=True).refresh() if fold else model
    infer = make_torch_infer(net, precision=precision, device=device, nms=nms, channels_last=True)
    seconds = []
    for _ in range(args["passes"]):
        start = time.perf_counter()
        validation = run_validation(infer, split, loader, progress=False)
        seconds.append(time.perf_counter() - start)
    result[name] = {"seconds": seconds, "map": validation.metrics["mAP50-95"]}
print("RESULT", json.dumps(result))
"""


def later(seconds: list[float]) -> str:
    """Median and range of the passes after the first (the first holds start-up), in seconds."""
    rest = seconds[1:] or seconds
    return f"{statistics.median(rest):.2f} ({min(rest):.2f}-{max(rest):.2f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="", help="data YAML (default: the built-in shapes dataset)")
    parser.add_argument("--weights", default="", help="an Ultralytics YOLOv8 .pt (default: train one)")
    parser.add_argument("--train-epochs", type=int, default=1, help="epochs for the weights made without --weights")
    parser.add_argument("--imgsz", type=int, default=320)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="val-same-weights-"))
    if not args.data:
        from detector.data.synthetic import generate_shapes

        args.data = str(generate_shapes())
    data = absolute_yaml(Path(args.data), work)
    weights = args.weights or run_isolated(ULTRALYTICS_TRAIN, {
        "data": str(data), "epochs": args.train_epochs, "imgsz": args.imgsz, "device": args.device,
        "project": str(work)})["weights"]
    payload = {"data": str(data), "weights": weights, "imgsz": args.imgsz, "batch": args.batch,
               "device": args.device, "passes": args.passes}
    theirs, ours = run_isolated(ULTRALYTICS_VAL, payload), run_isolated(OUR_VAL, payload)
    print(f"\nweights {weights}, data {args.data}, imgsz {args.imgsz}, batch {args.batch}, device {args.device}, "
          f"conf 0.001, {args.passes} passes per side\n")
    print("| validation | precision | first pass s | later passes s, median (range) | mAP50-95 |")
    print("|---|---|---|---|---|")
    for name, run, precision in (("detector, as training validates (folded, rect batches)", ours["as training"],
                                  ours["precision"]),
                                 ("detector, square batches", ours["square"], ours["precision"]),
                                 ("detector, square, BatchNorm not folded", ours["unfolded square"], ours["precision"]),
                                 ("Ultralytics `model.val` (its rect batches)", theirs, "its own")):
        print(f"| {name} | {precision} | {run['seconds'][0]:.2f} | {later(run['seconds'])} | {run['map']:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
