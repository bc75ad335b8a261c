"""``python -m detector val``: score a checkpoint on a dataset split.

Prints the per-class table (P / R at the best-F1 threshold, pycocotools AP50 and AP50-95) and the
pycocotools summary, and writes into ``<project>/<name>`` (``exp``, ``exp2``, ... when taken)::

    predictions.json      COCO results (xywh pixels of the original images)
    results.txt           the table and the summary, as printed
    PR_curve.png          precision-recall and F1-confidence curves (with --plots, the default)
    confusion_matrix.png  at conf 0.25, IoU 0.45
    val_batch0_pred.png   ground truth beside predictions for the first 16 images

Precision: FP32 on CPU (BF16 autocast is slower than FP32 on CPUs without AMX and shifts scores);
on CUDA the forward runs under autocast (BF16 where supported, else FP16) unless ``--fp32``.
NMS and box decoding always run in FP32.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

import torch

from detector.checkpoint import CheckpointError, model_from_checkpoint
from detector.data.build import build_split
from detector.data.spec import DatasetError, load_dataset_spec
from detector.model import YOLO
from detector.plots.validation import plot_all_validation, validation_stats
from detector.postprocess import NMSConfig, postprocess
from detector.report import per_class_table
from detector.validate import Detections, run_validation

DEFAULT_IMGSZ = 640  # when the checkpoint's config does not say
STRIDE_MULTIPLE = 32  # the model needs input sides divisible by its largest stride


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m detector val", description=__doc__.splitlines()[0])
    parser.add_argument("--weights", required=True, type=Path, help="checkpoint (.pt) written by training")
    parser.add_argument("--data", required=True, type=Path, help="dataset YAML")
    parser.add_argument("--imgsz", type=int, default=None,
                        help=f"input size (default: the checkpoint's training size, else {DEFAULT_IMGSZ})")
    parser.add_argument("--batch", type=int, default=32, help="images per batch")
    parser.add_argument("--workers", type=int, default=2, help="data-loader worker processes")
    parser.add_argument("--conf", type=float, default=0.001, help="confidence threshold before NMS")
    parser.add_argument("--iou", type=float, default=0.7, help="NMS IoU threshold")
    parser.add_argument("--max-det", type=int, default=300, help="detections kept per image")
    parser.add_argument("--split", choices=("val", "test"), default="val", help="dataset split to score")
    parser.add_argument("--device", default="", help="cpu, cuda or cuda:N (default: cuda when available)")
    parser.add_argument("--fp32", action="store_true", help="no autocast on CUDA (CPU always runs FP32)")
    parser.add_argument("--plots", action=argparse.BooleanOptionalAction, default=True,
                        help="write PR curve, confusion matrix and prediction images")
    parser.add_argument("--project", type=Path, default=Path("runs/val"), help="parent folder of the run folder")
    parser.add_argument("--name", default="exp", help="run folder name (suffixed 2, 3... when it exists)")
    return parser.parse_args(argv)


def increment_path(path: Path) -> Path:
    """``path`` if free, else ``path2``, ``path3``, ... (the first that does not exist)."""
    if not path.exists():
        return path
    number = 2
    while path.with_name(f"{path.name}{number}").exists():
        number += 1
    return path.with_name(f"{path.name}{number}")


def autocast_dtype(device: torch.device, fp32: bool) -> torch.dtype | None:
    """The autocast dtype for inference, or None for plain FP32 (see the module docstring for why)."""
    if fp32 or device.type != "cuda":
        return None
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def make_infer(
    model: YOLO, *, device: torch.device, amp_dtype: torch.dtype | None, nms: NMSConfig
) -> Callable[[torch.Tensor], Detections]:
    """``uint8 [B, 3, S, S]`` -> per image ``{boxes [n, 4] xyxy input px, scores [n], labels [n]}`` on CPU."""

    @torch.no_grad()
    def infer(images: torch.Tensor) -> Detections:
        inputs = images.to(device, non_blocking=True).float() / 255
        with torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
            outputs = model(inputs)
        outputs = [output.float() for output in outputs]  # decode + NMS in FP32
        detections = postprocess(outputs, strides=model.strides, reg_max=model.reg_max, config=nms)
        return [{key: value.cpu() for key, value in detection.items()} for detection in detections]

    return infer


def resolve_image_size(requested: int | None, config: dict | None) -> int:
    """``--imgsz``, else the checkpoint's ``config['imgsz']``, else 640; rounded up to a multiple of 32."""
    size = requested or int((config or {}).get("imgsz") or DEFAULT_IMGSZ)
    rounded = -(-size // STRIDE_MULTIPLE) * STRIDE_MULTIPLE
    if rounded != size:
        print(f"note: --imgsz {size} is not a multiple of {STRIDE_MULTIPLE}; using {rounded}")
    return rounded


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        spec = load_dataset_spec(args.data)
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
    except (CheckpointError, DatasetError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"error: --device {args.device} asked for, but CUDA is not available", file=sys.stderr)
        return 2
    amp_dtype = autocast_dtype(device, args.fp32)
    model = model.to(device).float()
    nms = NMSConfig(conf_threshold=args.conf, iou_threshold=args.iou, max_detections=args.max_det, multi_label=True)
    save_dir = increment_path(args.project / args.name)
    save_dir.mkdir(parents=True)
    print(f"val: {args.weights} on {spec.yaml_path.name} '{args.split}' ({len(split.records)} images), "
          f"imgsz {image_size}, {device.type} {'FP32' if amp_dtype is None else str(amp_dtype).removeprefix('torch.')}")

    result, info = run_validation(
        make_infer(model, device=device, amp_dtype=amp_dtype, nms=nms),
        split,
        batch_size=args.batch,
        workers=args.workers,
        results_json=save_dir / "predictions.json",
        progress=sys.stderr.isatty(),
        keep_predictions=True,
    )
    names = spec.names
    stats = (plot_all_validation(info["predictions"], split, names, save_dir) if args.plots
             else validation_stats(info["predictions"], split, len(names)))
    table = per_class_table(names, split.records, result, stats.precision, stats.recall)
    speed = 1000 * info["seconds"] / max(info["images"], 1)
    report = f"{table}\n\n{result.summary}\n\nSpeed: {speed:.1f} ms/image (inference, NMS and pycocotools)"
    (save_dir / "results.txt").write_text(report + "\n")
    print(report)
    print(f"Results saved to {save_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
