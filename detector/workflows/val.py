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

``--weights`` is one of our checkpoints, Ultralytics YOLOv8, YOLO11 or YOLO26 weights (``yolo11n.pt``, read by the safe
converter, detector/weights/ultralytics.py), or an export (``.onnx``, ``.engine``) run through its
:class:`~detector.inference.Backend`, the same runtime predict and benchmark use.

Precision of a ``.pt`` follows training's ``auto`` rule (``detector.precision``): FP16 autocast on CUDA, BF16 on
a CPU with native BF16 (AVX-512 BF16 / AMX), else FP32; ``--fp32`` turns autocast off. An export runs at the
precision it was exported with. Box decoding and NMS always run in FP32.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch

from detector.data.build import build_split
from detector.data.spec import DatasetError, load_dataset_spec, only_classes, single_class
from detector.data.workers import stop_workers
from detector.defaults import DEFAULT_IMGSZ
from detector.device import resolve_device
from detector.inference import Backend, exported_precision_note, load_backend
from detector.inference.augmented import AugmentedBackend
from detector.inference.fusion import fuse_conv_bn
from detector.inference.pt_model import model_from_pt
from detector.inference.torch_backend import TorchBackend, half_precision, make_torch_infer, use_one_to_one
from detector.metrics.coco import evaluator_name, resolve_backend
from detector.metrics.loop import Scoring, Validation, make_val_loader, run_validation
from detector.model import image_size_problem
from detector.model.metadata import ModelInfo
from detector.plots.reporter import validation_report
from detector.postprocess import NMSConfig
from detector.precision import Precision, resolve_precision
from detector.files import write_text_atomically
from detector.runs import run_folder
from detector.tuning import tune_process
from detector.weights.locate import located
from detector.workflows.options import ValOptions


def resolve_image_size(requested: int | None, config: dict | None) -> int:
    """``--imgsz``, else the checkpoint's ``config['imgsz']``, else 640; refused, as in training, unless a multiple
    of 32 (``ValueError``)."""
    size = requested or int((config or {}).get("imgsz") or DEFAULT_IMGSZ)
    if problem := image_size_problem(size):
        raise ValueError(problem)
    return size


def data_to_score(options: ValOptions, checkpoint: dict | None) -> tuple[str | Path, Path | None]:
    """``(--data, --datasets-dir)``; without ``--data``, those the checkpoint's training run was given (as typed
    there: a relative path resolves against this folder, said in a line first). ``ValueError`` where there are none
    (an export, Ultralytics weights)."""
    if options.data is not None:
        return options.data, options.datasets_dir
    config = (checkpoint or {}).get("config") or {}
    if checkpoint is None and not options.weights.is_file():  # said as with --data (load_backend's words)
        raise ValueError(f"{options.weights}: weights not found")
    if not config.get("data"):
        foreign = checkpoint is not None and checkpoint.get("source") == "ultralytics"
        kind = ("an export" if checkpoint is None else "Ultralytics weights" if foreign
                else "a checkpoint that names no dataset")
        raise ValueError(f"{options.weights} is {kind}: give the dataset to score with --data")
    print(f"val: --data {config['data']}, the dataset {options.weights.name} trained on")
    trained_in = config.get("datasets_dir")
    return config["data"], options.datasets_dir or (Path(trained_in) if trained_in else None)


def exported_image_size(requested: int | None, backend: Backend) -> int:
    """An export's own size, or ``--imgsz`` where the graph is dynamic (``ValueError`` where it is fixed)."""
    info = backend.info
    if requested and not info.dynamic and requested != info.imgsz:
        raise ValueError(f"{info.imgsz} px is fixed in this export; drop --imgsz or export with --dynamic")
    return resolve_image_size(requested or info.imgsz, None)


def trained_in(checkpoint: dict, precision: Precision) -> str:
    """``"; trained in FP32"`` where the checkpoint says it trained in another precision than this pass runs in (the
    score may differ slightly from training's: ``--fp32`` / ``--half`` choose), else ``""``."""
    trained = str(checkpoint.get("precision") or "")
    return f"; trained in {trained.upper()}" if trained and trained != precision.name else ""


def run_val(options: ValOptions) -> dict[str, float]:
    """Score ``options.weights`` on a split; returns the metrics (``mAP50-95``, ``mAP50``, ...).

    Raises:
        CheckpointError, DatasetError, ValueError: one line naming the file or flag.
    """
    device = resolve_device(options.device)
    tune_process(device)  # before the first convolution: see detector/tuning.py
    if options.half and options.fp32:
        raise ValueError("--half and --fp32 contradict each other; pick one")
    options = dataclasses.replace(options, weights=located(options.weights))  # yolov8n.pt: the weights folder's
    checkpoint = None
    if options.weights.suffix.lower() == ".pt":
        model, checkpoint = model_from_pt(options.weights)
        if options.end_to_end:  # YOLO26's one-to-one branch, for the top-k; refused in one line for another model
            use_one_to_one(model, source=options.weights)
    data, datasets_dir = data_to_score(options, checkpoint)
    spec = load_dataset_spec(data, datasets_dir=datasets_dir)
    nms = NMSConfig(conf_threshold=options.conf, iou_threshold=options.iou, max_detections=options.max_det,
                    multi_label=True, end_to_end=options.end_to_end)
    if checkpoint is not None:
        num_classes, names = model.num_classes, checkpoint.get("names")
        image_size = resolve_image_size(options.imgsz, checkpoint.get("config"))
        precision = resolve_precision("fp32" if options.fp32 else "auto", device)
        if options.fp32:  # the rule's reason names train's flag
            precision = Precision("fp32", device.type, "--fp32 requested")
        model = model.to(device).float()
        if options.half:  # the inference backend's prepared copy: fused, converted once, CUDA graphs on CUDA
            precision = Precision(half_precision(device), device.type, "--half: weights converted, no autocast")
            info = ModelInfo(names=spec.names, strides=tuple(model.strides), imgsz=image_size, dynamic=True)
            infer = TorchBackend(model, info, device=str(device), precision=precision.name, nms=nms)
            infer = AugmentedBackend(infer) if options.augment else infer
        else:  # BatchNorm folded and channels-last, as training's validation runs it (detector/inference/fusion.py)
            folded = fuse_conv_bn(model.eval()).to(memory_format=torch.channels_last)
            infer = make_torch_infer(folded, precision=precision, nms=nms, device=device, channels_last=True,
                                     augment=options.augment)
        runtime = f"{device.type} {precision.name.upper()} ({precision.reason}{trained_in(checkpoint, precision)})"
        runtime += ", augmented" if options.augment else ""
        runtime += ", end-to-end (one-to-one head, no NMS)" if options.end_to_end else ""
    else:
        backend = load_backend(options.weights, device=str(device), nms=nms)  # refuses --end-to-end without the head
        if note := exported_precision_note(options.weights, backend, half=options.half, fp32=options.fp32):
            print(note)
        num_classes, names = len(backend.info.names), backend.info.names
        image_size = exported_image_size(options.imgsz, backend)
        infer = AugmentedBackend(backend) if options.augment else backend  # refused here, before any note
        if backend.info.end_to_end and not options.end_to_end:
            print(f"note: {options.weights} was exported with --end-to-end: its one-to-one head's boxes are scored by "
                  "the NMS-free top-k (--iou unused)")
        if backend.info.nms is not None and backend.info.end_to_end:
            print(f"note: {options.weights} has its top-k inside (conf {backend.info.nms.conf_threshold}): mAP is "
                  "lower than with the Python top-k at --conf 0.001; export without --nms to evaluate")
        elif backend.info.nms is not None:
            print(f"note: {options.weights} has NMS inside (conf {backend.info.nms.conf_threshold}, one class per box):"
                  " mAP is lower than with the Python NMS at --conf 0.001; export without --nms to evaluate")
        runtime = infer.name
    trained_on = ((checkpoint or {}).get("config") or {}).get("classes")
    if trained_on is not None:  # train --classes: scored as training validated (before a --single-cls merge)
        print(f"note: {options.weights} trained on classes {' '.join(map(str, trained_on))} alone: only their boxes "
              "are scored")
        spec = only_classes(spec, tuple(trained_on))
    if num_classes == 1 < spec.num_classes:  # a one-class model (train --single-cls): scored as Ultralytics does
        kept = "kept " if spec.include_classes is not None else ""
        print(f"note: {options.weights} has one class: every {kept}box of {data}'s {spec.num_classes} classes counts "
              "as it")
        spec = single_class(spec)
    if num_classes != spec.num_classes:
        raise DatasetError(f"{data}: {spec.num_classes} classes but {options.weights} was trained for {num_classes}")
    if names and list(names) != spec.names:
        print(f"note: class names differ between {options.weights} and {data}; the table uses the data YAML's")
    # One pass over the images, so a RAM cache would only add its own load time and memory.
    split = build_split(spec, options.split, image_size=image_size, augment=None, cache="false")
    # Rectangular batches where the model takes any shape as it is (Backend.shapes_are_free; the eager PyTorch
    # function too): an export's runtime may build an engine per input shape (onnxruntime's TensorRT provider,
    # minutes each), and so does --half on CUDA (a CUDA graph per shape).
    rect = options.rect and getattr(infer, "shapes_are_free", True)
    coco_eval = resolve_backend(options.coco_eval)
    # A failure inside removes the run folder it claimed: a failed val leaves nothing behind.
    with run_folder(options.project, options.name) as save_dir:
        if options.verbose:
            print(f"val: {options.weights} on {spec.yaml_path.name} '{options.split}' ({len(split.records)} images), "
                  f"imgsz {image_size}{' (rect batches)' if rect else ''}, {runtime}, "
                  f"COCO eval {evaluator_name(coco_eval)}")

        loader = make_val_loader(split, batch_size=options.batch, workers=options.workers,
                                 cpu_compute=device.type == "cpu", pin_memory=device.type == "cuda", rect=rect)
        try:
            validation = run_validation(infer, split, loader, results_json=save_dir / "predictions.json",
                                        progress=options.verbose and sys.stderr.isatty(), keep_predictions=True,
                                        # P and R in the result too (the table's "all" row, as training's epochs
                                        # score it): Ultralytics' metrics.box.mp and .mr.
                                        scoring=Scoring(coco_eval, precision_recall=True))
        finally:
            stop_workers(loader)  # now, not at the process's exit (see stop_workers)
        result = validation.result
        table = validation_report(validation, split, spec.names, plot_dir=save_dir if options.plots else None)
        report = f"{table}\n\n{result.evaluator}:\n{result.summary}\n\n{speed_line(validation, result.evaluator)}"
        write_text_atomically(save_dir / "results.txt", report + "\n")
        if options.verbose:
            print(report)
            print(f"Results saved to {save_dir}")
        return dict(validation.metrics)


def speed_line(validation: Validation, evaluator: str) -> str:
    """The pass's time per image, by part (Ultralytics prints pre-process, inference and post-process): loading is
    the time the pass waited for decoded, letterboxed batches, so workers that keep ahead make it small."""
    per_image = 1000 / max(validation.images, 1)
    parts = validation.parts
    return (f"Speed: {validation.seconds * per_image:.1f} ms per image: {parts['loading'] * per_image:.1f} ms waiting "
            f"for images (decoding, letterboxing), {parts['inference'] * per_image:.1f} ms inference and NMS, "
            f"{parts['scoring'] * per_image:.1f} ms scoring ({evaluator.split()[0]})")
