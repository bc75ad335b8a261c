"""``python -m detector val``: score a checkpoint on a dataset split.

Prints the per-class table (P / R at the best-F1 threshold, COCO AP50 and AP50-95) and the COCO summary,
naming the evaluator that computed them (``--coco-eval``: faster-coco-eval by default, pycocotools on request;
the same numbers, see detector/metrics/coco.py), and writes into ``<project>/<name>`` (``exp``, ``exp2``, ...
when taken)::

    predictions.json      COCO results (xywh pixels of the original images)
    results.txt           the table and the summary, as printed
    PR_curve.png          precision-recall and F1-confidence curves (with --plots, the default)
    confusion_matrix.png  at conf 0.25, IoU 0.45
    val_batch0_pred.png   ground truth beside predictions for the first 16 images

Precision follows training's ``auto`` rule (``detector.precision``): FP16 autocast on CUDA, BF16 on a
CPU with native BF16 (AVX-512 BF16 / AMX), else FP32; ``--fp32`` turns autocast off. Box decoding and
NMS always run in FP32.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from detector.checkpoint import CheckpointError, model_from_checkpoint
from detector.data.build import build_split
from detector.data.spec import DatasetError, load_dataset_spec
from detector.device import resolve_device
from detector.inference.torch_backend import DEFAULT_IMGSZ, make_torch_infer
from detector.metrics.coco import BACKENDS, evaluator_name, resolve_backend
from detector.metrics.loop import run_validation
from detector.model import image_size_problem
from detector.plots.reporter import validation_report
from detector.postprocess import NMSConfig
from detector.precision import resolve_precision
from detector.runs import next_run_dir
from detector.tuning import enlarge_onednn_cache


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m detector val", description=__doc__.splitlines()[0])
    parser.add_argument("--weights", required=True, type=Path, help="checkpoint (.pt) written by training")
    parser.add_argument("--data", required=True, type=Path, help="dataset YAML, or a shipped one's name (coco.yaml)")
    parser.add_argument("--datasets-dir", type=Path, default=None,
                        help="root of downloaded datasets (default: $DETECTOR_DATASETS, else ./datasets)")
    parser.add_argument("--imgsz", type=int, default=None,
                        help=f"input size (default: the checkpoint's training size, else {DEFAULT_IMGSZ})")
    parser.add_argument("--batch", type=int, default=32, help="images per batch")
    parser.add_argument("--workers", type=int, default=2, help="data-loader worker processes")
    parser.add_argument("--conf", type=float, default=0.001, help="confidence threshold before NMS")
    parser.add_argument("--iou", type=float, default=0.7, help="NMS IoU threshold")
    parser.add_argument("--max-det", type=int, default=300, help="detections kept per image")
    parser.add_argument("--split", choices=("val", "test"), default="val", help="dataset split to score")
    parser.add_argument("--coco-eval", choices=BACKENDS, default="faster",
                        help="COCO mAP evaluator: faster (faster-coco-eval; pycocotools when not installed) or "
                             "pycocotools (the same numbers, slower)")
    parser.add_argument("--device", default="", help="cpu, cuda or cuda:N (default: cuda when available)")
    parser.add_argument("--fp32", action="store_true", help="run the model in FP32 (no FP16/BF16 autocast)")
    parser.add_argument("--plots", action=argparse.BooleanOptionalAction, default=True,
                        help="write PR curve, confusion matrix and prediction images")
    parser.add_argument("--project", type=Path, default=Path("runs/val"), help="parent folder of the run folder")
    parser.add_argument("--name", default="exp", help="run folder name (suffixed 2, 3... when it exists)")
    return parser


def resolve_image_size(requested: int | None, config: dict | None) -> int:
    """``--imgsz``, else the checkpoint's ``config['imgsz']``, else 640; refused, as in training, unless a multiple
    of 32 (``ValueError``)."""
    size = requested or int((config or {}).get("imgsz") or DEFAULT_IMGSZ)
    if problem := image_size_problem(size):
        raise ValueError(problem)
    return size


def run_val(args: argparse.Namespace) -> dict[str, float]:
    """The command without its error handling; returns the metrics (``mAP50-95``, ``mAP50``, ...).

    Raises:
        CheckpointError, DatasetError, ValueError: one line naming the file or flag.
    """
    spec = load_dataset_spec(args.data, datasets_dir=args.datasets_dir)
    model, checkpoint = model_from_checkpoint(args.weights)
    if model.num_classes != spec.num_classes:
        raise DatasetError(
            f"{args.data}: {spec.num_classes} classes but {args.weights} was trained for {model.num_classes}"
        )
    if checkpoint.get("names") and list(checkpoint["names"]) != spec.names:
        print(f"note: class names differ between {args.weights} and {args.data}; the table uses the data YAML's")
    image_size = resolve_image_size(args.imgsz, checkpoint.get("config"))
    # One pass over the images, so a RAM cache would only add its own load time and memory.
    split = build_split(spec, args.split, image_size=image_size, augment=None, cache="false")
    device = resolve_device(args.device)

    precision = resolve_precision("fp32" if args.fp32 else "auto", device)
    model = model.to(device).float()
    nms = NMSConfig(conf_threshold=args.conf, iou_threshold=args.iou, max_detections=args.max_det, multi_label=True)
    coco_eval = resolve_backend(args.coco_eval)
    save_dir = next_run_dir(args.project, args.name)
    save_dir.mkdir(parents=True)
    print(f"val: {args.weights} on {spec.yaml_path.name} '{args.split}' ({len(split.records)} images), "
          f"imgsz {image_size}, {device.type} {precision.name.upper()} ({precision.reason}), "
          f"COCO eval {evaluator_name(coco_eval)}")

    result, info = run_validation(
        make_torch_infer(model, precision=precision, nms=nms, device=device),
        split,
        batch_size=args.batch,
        workers=args.workers,
        cpu_compute=device.type == "cpu",
        results_json=save_dir / "predictions.json",
        progress=sys.stderr.isatty(),
        keep_predictions=True,
        coco_eval=coco_eval,
    )
    table = validation_report(info["predictions"], split, spec.names, result, plot_dir=save_dir if args.plots else None)
    speed = 1000 * info["seconds"] / max(info["images"], 1)
    report = (f"{table}\n\n{result.evaluator}:\n{result.summary}\n\n"
              f"Speed: {speed:.1f} ms/image (inference, NMS and {result.evaluator.split()[0]})")
    (save_dir / "results.txt").write_text(report + "\n")
    print(report)
    print(f"Results saved to {save_dir}")
    return dict(result.metrics)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    enlarge_onednn_cache()  # before the first convolution: see detector/tuning.py
    try:
        run_val(args)
    except (CheckpointError, DatasetError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
