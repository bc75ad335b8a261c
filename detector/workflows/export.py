"""``python export.py`` / ``python -m detector export``: checkpoint -> ONNX, TensorRT and/or pt2, then a parity check.

Files are built in a hidden staging folder beside the checkpoint and renamed into place
(``best.pt`` -> ``best.onnx`` / ``best.engine`` / ``best.pt2``) only after the parity check passes, so a failed export
or check leaves nothing behind. A bare name found in the weights folder (``--weights yolov8n.pt``) exports into the
current folder instead (:func:`export_folder`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from detector.architecture import display_name
from detector.inference.pt_model import model_from_pt
from detector.defaults import DEFAULT_IMGSZ
from detector.device import resolve_device
from detector.exporting import ExportError
from detector.exporting.onnx import export_onnx
from detector.exporting.pt2 import compiler_missing, export_pt2, pt2_precision
from detector.exporting.parity import check_parity, split_images, synthetic_images
from detector.exporting.tensorrt import build_engine
from detector.extras import Unavailable
from detector.files import publish, staging_folder
from detector.inference import load_backend, weights_or_latest
from detector.inference.backend import end_to_end_refusal
from detector.inference.tensorrt_backend import tensorrt_missing
from detector.inference.torch_backend import TorchBackend
from detector.model import YOLO, image_size_problem
from detector.model.metadata import ModelInfo
from detector.postprocess import NMSConfig
from detector.precision import fp32_settings_kept, set_strict_fp32
from detector.tuning import enlarge_onednn_cache
from detector.weights.locate import is_bare_name
from detector.workflows.options import ExportOptions, parse_formats


def resolve_weights(weights: Path | None) -> Path:
    path = weights_or_latest(weights)
    if weights is None:
        print(f"export: using the newest checkpoint {path}")
    return path


def export_folder(given: Path | None, weights: Path) -> Path:
    """Where the exports of ``weights`` go: beside the checkpoint, except for a bare name ``given`` that was found in
    the weights folder (``--weights yolov8n.pt``, no such file here), which exports into the current folder.

    Ultralytics writes beside the file it loaded, which for a bare name is the current folder (it downloads it
    there); writing into the weights folder put the export where the user does not look, in a folder shared by
    every project (and perhaps read-only).
    """
    if given is not None and is_bare_name(given) and weights != given:
        return Path.cwd()
    return weights.parent


def model_info(options: ExportOptions, names: list[str], strides: tuple[int, ...], trained: int | None) -> ModelInfo:
    """What the export will be: ``trained`` is the checkpoint's training image size, if it recorded one."""
    imgsz = options.imgsz or trained or DEFAULT_IMGSZ
    if problem := image_size_problem(imgsz):
        raise ValueError(problem)
    if options.batch < 1:
        raise ValueError(f"--batch must be at least 1 (got {options.batch})")
    nms = None
    if options.nms:  # with --end-to-end, the top-k in the graph instead of NMS
        nms = NMSConfig(conf_threshold=options.conf, iou_threshold=options.iou, max_detections=options.max_det,
                        end_to_end=options.end_to_end)
    return ModelInfo(
        names=names, strides=strides, imgsz=imgsz, batch=options.batch, dynamic=options.dynamic,
        precision="fp16" if options.half else "fp32", nms=nms, end_to_end=options.end_to_end,
    )


def stage_exports(
    model: YOLO, info: ModelInfo, formats: list[str], staging: Path, stem: str, options: ExportOptions, device: str
) -> dict[str, Path]:
    """Write every requested format into ``staging``; -> format -> file."""
    staged: dict[str, Path] = {}
    onnx_options = {"opset": options.opset, "simplify": options.simplify, "device": device}
    if "onnx" in formats:
        staged["onnx"] = export_onnx(model, staging / f"{stem}.onnx", info, **onnx_options)
    if "engine" in formats:
        # The ONNX export at the engine's precision: TensorRT keeps its types (detector/exporting/tensorrt.py).
        source = staged.get("onnx") or export_onnx(model, staging / "engine-source.onnx", info, **onnx_options)
        staged["engine"] = build_engine(source, staging / f"{stem}.engine", info, workspace_gib=options.workspace,
                                       device=device)
    if "pt2" in formats:  # --dynamic frees a package's batch; its height and width stay --imgsz
        pt2_info = dataclasses.replace(info, precision=pt2_precision(options.half, device), dynamic=False,
                                       batch_free=options.dynamic)
        staged["pt2"] = export_pt2(model, staging / f"{stem}.pt2", pt2_info, device=device)
    return staged


def check_parity_of(
    model: YOLO, info: ModelInfo, staged: dict[str, Path], options: ExportOptions, device: str
) -> None:
    """Check each staged file against the FP32 PyTorch model; print the reports. Raises ExportError on a failure."""
    split = None
    if options.data is not None:
        from detector.data.build import build_split
        from detector.data.spec import load_dataset_spec, single_class

        spec = load_dataset_spec(options.data, datasets_dir=options.datasets_dir)
        spec = single_class(spec) if len(info.names) == 1 < spec.num_classes else spec  # a --single-cls model
        split = build_split(spec, "val", image_size=info.imgsz, augment=None)
    reference = TorchBackend(model, dataclasses.replace(info, dynamic=True, nms=None), device=device)
    images = split_images(split) if split is not None else synthetic_images(info.imgsz)
    # The reference in true FP32: cuDNN's convolutions default to TF32 on Ampere and later (10 mantissa bits), which
    # would move the reference by more than the FP32 tolerances the check derives; the setting is put back after.
    with fp32_settings_kept():
        set_strict_fp32()
        for fmt, path in staged.items():
            report = check_parity(
                reference, load_backend(path, device=device), images=images, split=split,
                map_margin=options.map_margin, score_tolerance=options.score_tol, workers=options.workers,
            )
            print(report.summary())
            if not report.passed:
                raise ExportError(f"{fmt} export failed the parity check; nothing was written")


def run_export(options: ExportOptions) -> list[Path]:
    """Export ``options.weights`` (else the newest best.pt); returns the files written (one per format).

    Raises:
        CheckpointError, DatasetError, FileNotFoundError, ValueError, ExportError, Unavailable: one line;
        nothing is written.
    """
    enlarge_onednn_cache()  # before the first convolution: see detector/tuning.py
    formats = parse_formats(options.format)
    if "engine" in formats and (reason := tensorrt_missing()):
        raise Unavailable(f"{reason}; nothing was written")
    if "pt2" in formats and (reason := compiler_missing()):
        raise Unavailable(f"{reason}; nothing was written")
    weights = resolve_weights(options.weights)
    device = str(resolve_device(options.device))
    if "pt2" in formats:
        if options.nms:  # the graph's NMS loops over the batch in Python: never compiled into a package
            raise ValueError("--format pt2 has no NMS inside; drop --nms, predict/val/benchmark apply NMS after the "
                             "package")
        pt2_precision(options.half, device)  # refuses --half where it would not pay, before any work
    model, checkpoint = model_from_pt(weights)  # ours, or Ultralytics YOLOv8/YOLO11/YOLO26 weights, as val reads them
    if options.end_to_end and not model.head.end_to_end:  # before any work: YOLOv8 and YOLO11 have no such head
        raise ValueError(end_to_end_refusal(str(weights), f"this is a {display_name(model.scale)} model"))
    names = list(checkpoint.get("names") or [str(i) for i in range(model.num_classes)])
    info = model_info(options, names, tuple(model.strides), (checkpoint.get("config") or {}).get("imgsz"))
    folder = export_folder(options.weights, weights)
    with staging_folder(folder) as staging:
        staged = stage_exports(model, info, formats, staging, weights.stem, options, device)
        if not options.no_check:
            check_parity_of(model, info, staged, options, device)
        written = []
        for fmt, path in staged.items():
            target = folder / f"{weights.stem}.{fmt}"
            replacing = target.exists()  # an FP32 export and a --half one share the name: say the earlier one went
            written.append(publish(path, target))
            print(f"export: wrote {written[-1]}{' (replacing the earlier export there)' if replacing else ''}")
    return written
