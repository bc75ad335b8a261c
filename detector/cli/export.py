"""``python export.py`` / ``python -m detector export``: checkpoint -> ONNX and/or TensorRT, then a parity check.

Files are built in a hidden staging folder beside the checkpoint and renamed into place
(``best.pt`` -> ``best.onnx`` / ``best.engine``) only after the parity check passes, so a failed export
or check leaves nothing behind.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from detector.checkpoint import CheckpointError, model_from_checkpoint
from detector.data.spec import DatasetError
from detector.device import resolve_device
from detector.exporting.onnx import DEFAULT_OPSET, export_onnx
from detector.exporting.parity import SCORE_TOLERANCE, check_parity, split_images, synthetic_images
from detector.exporting.tensorrt import DEFAULT_WORKSPACE_GIB, build_engine
from detector.exporting.wrapper import EXPORT_NMS
from detector.files import publish, staging_folder
from detector.inference import find_latest_checkpoint, load_backend
from detector.inference.tensorrt_backend import tensorrt_missing
from detector.inference.torch_backend import DEFAULT_IMGSZ, TorchBackend
from detector.model import YOLO, image_size_problem
from detector.model.metadata import ModelInfo
from detector.postprocess import NMSConfig
from detector.tuning import enlarge_onednn_cache

FORMATS = ("onnx", "engine")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="export.py",
        description="Export a checkpoint to ONNX and/or TensorRT, then check it against the FP32 PyTorch model.",
        epilog="Input 'images' float32 [B,3,H,W] RGB in [0,1]. Outputs: 'boxes' [B,A,4] xyxy px + 'scores' [B,A,C]; "
        "with --nms 'detections' [B,K,6] (x1,y1,x2,y2,score,label; zero rows pad) + 'num_detections' [B].",
    )
    add = parser.add_argument
    nms = EXPORT_NMS
    add("--weights", type=Path, help="checkpoint .pt (default: the newest runs/train/*/weights/best.pt)")
    add("--format", default="onnx", help="onnx, engine, or onnx,engine (default: onnx)")
    add("--half", action="store_true", help="FP16 convolutions; inputs/outputs stay FP32 (default: off)")
    add("--imgsz", type=int,
        help=f"square input size, a multiple of 32 (default: the training size, else {DEFAULT_IMGSZ})")
    add("--batch", type=int, default=1, help="batch size; with --dynamic the largest TensorRT batch (default: 1)")
    add("--dynamic", action="store_true", help="free batch, height and width (default: off, fixed shape)")
    add("--opset", type=int, default=DEFAULT_OPSET, help=f"ONNX opset (default: {DEFAULT_OPSET})")
    add("--simplify", action="store_true", help="slim the ONNX graph with onnxslim (default: off)")
    add("--nms", action="store_true",
        help="NMS inside the graph, one class per box: outputs detections + num_detections (default: off)")
    add("--conf", type=float, default=nms.conf_threshold,
        help=f"with --nms: score threshold (default: {nms.conf_threshold})")
    add("--iou", type=float, default=nms.iou_threshold,
        help=f"with --nms: IoU threshold (default: {nms.iou_threshold})")
    add("--max-det", type=int, default=nms.max_detections,
        help=f"with --nms: K, detections per image (default: {nms.max_detections})")
    add("--data", type=Path,
        help="dataset YAML: check parity on its val split, with mAP (default: synthetic images, no mAP)")
    add("--datasets-dir", type=Path, default=None,
        help="with --data: root of downloaded datasets (default: $DETECTOR_DATASETS, else ./datasets)")
    add("--no-check", action="store_true", help="skip the parity check (default: check)")
    add("--map-margin", type=float, default=0.5,
        help="with --data: largest allowed mAP50-95 drop in points (default: 0.5)")
    add("--score-tol", type=float, default=SCORE_TOLERANCE,
        help=f"without --data: largest allowed score difference (default: {SCORE_TOLERANCE})")
    add("--workers", type=int, default=2, help="with --data: data-loading processes for the check (default: 2)")
    add("--device", default="",
        help="cpu, cuda or cuda:N: device for tracing and the check (default: cuda if available, else cpu)")
    add("--workspace", type=float, default=DEFAULT_WORKSPACE_GIB,
        help=f"TensorRT workspace in GiB (default: {DEFAULT_WORKSPACE_GIB})")
    return parser


def parse_formats(text: str) -> list[str]:
    formats = [part.strip().lower() for part in text.split(",") if part.strip()]
    unknown = [part for part in formats if part not in FORMATS]
    if unknown or not formats:
        raise ValueError(f"--format {text!r}: choose from {', '.join(FORMATS)} (comma-separated)")
    return list(dict.fromkeys(formats))


def resolve_weights(weights: Path | None) -> Path:
    if weights is not None:
        return weights
    latest = find_latest_checkpoint()
    if latest is None:
        raise FileNotFoundError("no --weights given and no runs/train/*/weights/best.pt found")
    print(f"export: using the newest checkpoint {latest}")
    return latest


def model_info(args: argparse.Namespace, names: list[str], strides: tuple[int, ...], trained: int | None) -> ModelInfo:
    """What the export will be: ``trained`` is the checkpoint's training image size, if it recorded one."""
    imgsz = args.imgsz or trained or DEFAULT_IMGSZ
    if problem := image_size_problem(imgsz):
        raise ValueError(problem)
    if args.batch < 1:
        raise ValueError(f"--batch must be at least 1 (got {args.batch})")
    nms = NMSConfig(conf_threshold=args.conf, iou_threshold=args.iou, max_detections=args.max_det) if args.nms else None
    return ModelInfo(
        names=names, strides=strides, imgsz=imgsz, batch=args.batch, dynamic=args.dynamic,
        precision="fp16" if args.half else "fp32", nms=nms,
    )


def stage_exports(
    model: YOLO, info: ModelInfo, formats: list[str], staging: Path, stem: str, args: argparse.Namespace, device: str
) -> dict[str, Path]:
    """Write every requested format into ``staging``; -> format -> file."""
    staged: dict[str, Path] = {}
    options = {"opset": args.opset, "simplify": args.simplify, "device": device}
    if "onnx" in formats:
        staged["onnx"] = export_onnx(model, staging / f"{stem}.onnx", info, **options)
    if "engine" in formats:
        # TensorRT gets the FP32 graph and picks FP16 kernels itself under BuilderFlag.FP16.
        if "onnx" in staged and info.precision == "fp32":
            source = staged["onnx"]
        else:
            fp32_info = dataclasses.replace(info, precision="fp32")
            source = export_onnx(model, staging / "engine-source.onnx", fp32_info, **options)
        staged["engine"] = build_engine(source, staging / f"{stem}.engine", info, workspace_gib=args.workspace)
    return staged


def check_parity_of(
    model: YOLO, info: ModelInfo, staged: dict[str, Path], args: argparse.Namespace, device: str
) -> None:
    """Check each staged file against the FP32 PyTorch model; print the reports. Raises RuntimeError on a failure."""
    split = None
    if args.data is not None:
        from detector.data.build import build_split
        from detector.data.spec import load_dataset_spec

        spec = load_dataset_spec(args.data, datasets_dir=args.datasets_dir)
        split = build_split(spec, "val", image_size=info.imgsz, augment=None)
    reference = TorchBackend(model, dataclasses.replace(info, dynamic=True, nms=None), device=device)
    images = split_images(split) if split is not None else synthetic_images(info.imgsz)
    for fmt, path in staged.items():
        report = check_parity(
            reference, load_backend(path, device=device), images=images, split=split,
            map_margin=args.map_margin, score_tolerance=args.score_tol, workers=args.workers,
        )
        print(report.summary())
        if not report.passed:
            raise RuntimeError(f"{fmt} export failed the parity check; nothing was written")


def run_export(args: argparse.Namespace) -> list[Path]:
    """The command without its error handling; returns the files written (one per format).

    Raises:
        CheckpointError, DatasetError, FileNotFoundError, ValueError, RuntimeError: one line; nothing is written.
    """
    formats = parse_formats(args.format)
    if "engine" in formats and (reason := tensorrt_missing()):
        raise RuntimeError(f"{reason}; nothing was written")
    weights = resolve_weights(args.weights)
    device = str(resolve_device(args.device))
    model, checkpoint = model_from_checkpoint(weights)
    names = list(checkpoint.get("names") or [str(i) for i in range(model.num_classes)])
    info = model_info(args, names, tuple(model.strides), (checkpoint.get("config") or {}).get("imgsz"))
    with staging_folder(weights.parent) as staging:
        staged = stage_exports(model, info, formats, staging, weights.stem, args, device)
        if not args.no_check:
            check_parity_of(model, info, staged, args, device)
        written = []
        for fmt, path in staged.items():
            written.append(publish(path, weights.with_suffix("." + fmt)))
            print(f"export: wrote {written[-1]}")
    return written


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    enlarge_onednn_cache()  # before the first convolution: see detector/tuning.py
    try:
        run_export(args)
        return 0
    except (CheckpointError, DatasetError, FileNotFoundError, ValueError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
