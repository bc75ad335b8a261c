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

import sys
from dataclasses import dataclass
from pathlib import Path

from detector.checkpoint import model_from_checkpoint
from detector.data.build import build_split
from detector.data.spec import DatasetError, load_dataset_spec
from detector.device import resolve_device
from detector.inference.torch_backend import DEFAULT_IMGSZ, TorchBackend, half_precision, make_torch_infer
from detector.metrics.coco import BACKENDS, evaluator_name, resolve_backend
from detector.metrics.loop import make_val_loader, run_validation
from detector.model import image_size_problem
from detector.model.metadata import ModelInfo
from detector.plots.reporter import validation_report
from detector.postprocess import NMSConfig
from detector.precision import Precision, resolve_precision
from detector.runs import next_run_dir
from detector.tuning import enlarge_onednn_cache
from detector.options import Options, option


@dataclass(kw_only=True)
class ValOptions(Options):
    """The flags of ``python -m detector val``."""

    weights: Path = option(help="checkpoint (.pt) written by training")
    data: Path = option(help="dataset YAML, or a shipped one's name (coco.yaml)")
    datasets_dir: Path | None = option(None, "root of downloaded datasets (default: $DETECTOR_DATASETS, else "
                                             "./datasets)")
    imgsz: int | None = option(None, f"input size (default: the checkpoint's training size, else {DEFAULT_IMGSZ})")
    batch: int = option(32, "images per batch")
    workers: int = option(2, "data-loader worker processes")
    conf: float = option(0.001, "confidence threshold before NMS")
    iou: float = option(0.7, "NMS IoU threshold")
    max_det: int = option(300, "detections kept per image")
    split: str = option("val", "dataset split to score", choices=("val", "test"))
    coco_eval: str = option("faster", "COCO mAP evaluator: faster (faster-coco-eval; pycocotools when not installed) "
                                      "or pycocotools (the same numbers, slower)", choices=BACKENDS)
    device: str = option("", "cpu, cuda or cuda:N (default: cuda when available)")
    fp32: bool = option(False, "run the model in FP32 (no FP16/BF16 autocast)")
    half: bool = option(False, "a prepared copy: FP16 weights + CUDA graphs on CUDA, BF16 on CPUs with native BF16, "
                               "else FP32; BatchNorm folded (default: off, autocast)")
    plots: bool = option(True, "write PR curve, confusion matrix and prediction images")
    project: Path = option(Path("runs/val"), "parent folder of the run folder")
    name: str = option("exp", "run folder name (suffixed 2, 3... when it exists)")


def resolve_image_size(requested: int | None, config: dict | None) -> int:
    """``--imgsz``, else the checkpoint's ``config['imgsz']``, else 640; refused, as in training, unless a multiple
    of 32 (``ValueError``)."""
    size = requested or int((config or {}).get("imgsz") or DEFAULT_IMGSZ)
    if problem := image_size_problem(size):
        raise ValueError(problem)
    return size


def run_val(options: ValOptions) -> dict[str, float]:
    """Score ``options.weights`` on a split; returns the metrics (``mAP50-95``, ``mAP50``, ...).

    Raises:
        CheckpointError, DatasetError, ValueError: one line naming the file or flag.
    """
    enlarge_onednn_cache()  # before the first convolution: see detector/tuning.py
    spec = load_dataset_spec(options.data, datasets_dir=options.datasets_dir)
    model, checkpoint = model_from_checkpoint(options.weights)
    if model.num_classes != spec.num_classes:
        raise DatasetError(
            f"{options.data}: {spec.num_classes} classes but {options.weights} was trained for {model.num_classes}"
        )
    if checkpoint.get("names") and list(checkpoint["names"]) != spec.names:
        print(f"note: class names differ between {options.weights} and {options.data}; the table uses the data YAML's")
    image_size = resolve_image_size(options.imgsz, checkpoint.get("config"))
    # One pass over the images, so a RAM cache would only add its own load time and memory.
    split = build_split(spec, options.split, image_size=image_size, augment=None, cache="false")
    device = resolve_device(options.device)

    if options.half and options.fp32:
        raise ValueError("--half and --fp32 contradict each other; pick one")
    precision = resolve_precision("fp32" if options.fp32 else "auto", device)
    if options.half:
        precision = Precision(half_precision(device), device.type, "--half: weights converted, no autocast")
    model = model.to(device).float()
    nms = NMSConfig(conf_threshold=options.conf, iou_threshold=options.iou, max_detections=options.max_det,
                    multi_label=True)
    coco_eval = resolve_backend(options.coco_eval)
    save_dir = next_run_dir(options.project, options.name)
    save_dir.mkdir(parents=True)
    print(f"val: {options.weights} on {spec.yaml_path.name} '{options.split}' ({len(split.records)} images), "
          f"imgsz {image_size}, {device.type} {precision.name.upper()} ({precision.reason}), "
          f"COCO eval {evaluator_name(coco_eval)}")

    infer = make_torch_infer(model, precision=precision, nms=nms, device=device)
    if options.half:  # the inference backend's prepared copy: fused, converted once, CUDA graphs on CUDA
        info = ModelInfo(names=spec.names, strides=tuple(model.strides), imgsz=image_size, dynamic=True)
        infer = TorchBackend(model, info, device=str(device), precision=precision.name, nms=nms)
    loader = make_val_loader(split, batch_size=options.batch, workers=options.workers,
                             cpu_compute=device.type == "cpu")
    validation = run_validation(
        infer,
        split,
        loader,
        results_json=save_dir / "predictions.json",
        progress=sys.stderr.isatty(),
        keep_predictions=True,
        coco_eval=coco_eval,
    )
    result = validation.result
    table = validation_report(validation, split, spec.names, plot_dir=save_dir if options.plots else None)
    speed = 1000 * validation.seconds / max(validation.images, 1)
    report = (f"{table}\n\n{result.evaluator}:\n{result.summary}\n\n"
              f"Speed: {speed:.1f} ms/image (inference, NMS and {result.evaluator.split()[0]})")
    (save_dir / "results.txt").write_text(report + "\n")
    print(report)
    print(f"Results saved to {save_dir}")
    return dict(result.metrics)
