"""The workflows' option dataclasses: one per command, its fields the command's flags (detector/options.py).

Kept apart from the workflows, and importing nothing heavy, so that every command's ``--help`` prints without
importing torch (0.2 s, where importing the workflow first took ~7 s on a 2-core EPYC). The defaults the help
shows come from detector/defaults.py and the fixed value sets from detector/choices.py, which the code that
acts on them imports too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from detector.choices import BENCHMARK_SKIP, COCO_EVAL, EXPORT_FORMAT
from detector.defaults import (
    DEFAULT_IMGSZ,
    DEFAULT_OPSET,
    DEFAULT_WORKSPACE_GIB,
    EXPORT_CONF,
    EXPORT_IOU,
    EXPORT_MAX_DET,
    SCORE_TOLERANCE,
)
from detector.options import Options, option
from detector.runs import name_problem

# val's and predict's --end-to-end: what it is, what it needs, and Ultralytics' names for both branches.
END_TO_END_HELP = ("YOLO26 only: its NMS-free one-to-one head, each image's best --max-det (box, class) pairs above "
                   "--conf, no NMS (--iou unused; Ultralytics' nms=False) (default: off: the usual head with NMS, "
                   "Ultralytics 8.4's default)")


@dataclass(kw_only=True)
class ValOptions(Options):
    """The flags of ``python -m detector val``."""

    weights: Path = option(help="checkpoint (.pt) written by training, Ultralytics yolov8*.pt or yolo11*.pt, or an "
                                "export (.onnx, .engine, .pt2)")
    data: Path | None = option(None, "dataset YAML, or a shipped one's name (coco.yaml) (default: the one a checkpoint "
                                     "of ours trained on, as Ultralytics' val does)")
    datasets_dir: Path | None = option(None, "root of downloaded datasets (default: $DETECTOR_DATASETS, else "
                                             "datasets/ in the data folder)")
    imgsz: int | None = option(None, f"input size (default: the checkpoint's training size, else {DEFAULT_IMGSZ})")
    batch: int = option(32, "images per batch")
    workers: int = option(2, "data-loader worker processes")
    conf: float = option(0.001, "confidence threshold before NMS")
    iou: float = option(0.7, "NMS IoU threshold")
    max_det: int = option(300, "detections kept per image")
    rect: bool = option(True, "batches of similar aspect ratio, each padded only to its own shape, as training "
                              "validates (PyTorch weights; exports and --half on CUDA score in squares)")
    split: str = option("val", "dataset split to score", choices=("val", "test", "train"))
    coco_eval: str = option("faster", "COCO mAP evaluator: faster (faster-coco-eval; pycocotools when not installed) "
                                      "or pycocotools (the same numbers, slower)", choices=COCO_EVAL)
    device: str = option("", "cpu, cuda, cuda:N or N (default: cuda when available)")
    fp32: bool = option(False, "run the model in FP32 (no FP16/BF16 autocast)")
    half: bool = option(False, "a prepared copy: FP16 weights + CUDA graphs on CUDA, BF16 on CPUs with native BF16, "
                               "else FP32 (default: off, autocast); BatchNorm is folded either way")
    augment: bool = option(False, "test-time augmentation: each batch also run flipped at 0.83 of its size and at 0.67,"
                                  " one NMS over the three (Ultralytics' augment=True; ~2.1x the time)")
    end_to_end: bool = option(False, END_TO_END_HELP)
    plots: bool = option(True, "write PR curve, confusion matrix and prediction images")
    verbose: bool = option(True, "print the per-class table and summary (--no-verbose: results.txt only)")
    project: Path = option(Path("runs/val"), "parent folder of the run folder")
    name: str = option("exp", "run folder name (suffixed 2, 3... when it exists)")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_detection_flags(conf=self.conf, iou=self.iou, max_det=self.max_det, imgsz=self.imgsz)
        at_least(("--batch", self.batch, 1), ("--workers", self.workers, 0))
        check_end_to_end(self.end_to_end, augment=self.augment)


@dataclass(kw_only=True)
class PredictOptions(Options):
    """The flags of ``python -m detector predict``."""

    weights: Path | None = option(None, ".pt (ours, or an Ultralytics yolov8*.pt or yolo11*.pt), .onnx, .engine or "
                                        ".pt2 (default: the newest runs/train/*/weights/best.pt)")
    source: str = option(help="an image, a folder (searched recursively), a glob ('imgs/*.jpg'), a video, a "
                              "webcam index (0) or a stream URL (rtsp://, http://)")
    save: bool = option(False, "write annotated images / video (default: off; predictions.json always)")
    save_txt: bool = option(False, "write YOLO labels labels/<image>.txt: class cx cy w h, normalised (default: off)")
    save_conf: bool = option(False, "with --save-txt: each box's score as a sixth column (default: off)")
    classes: tuple[int, ...] | None = option(None, "keep only these class ids, e.g. --classes 0 2 (default: all)")
    conf: float = option(0.25, "score threshold (default: 0.25)")
    iou: float = option(0.7, "NMS IoU threshold (default: 0.7)")
    max_det: int = option(300, "detections kept per image (default: 300)")
    agnostic_nms: bool = option(False, "NMS across classes: a box suppresses overlapping boxes of any class "
                                       "(default: off, per class)")
    imgsz: int | None = option(None, "input size (default: the model's own: training or export size)")
    batch: int = option(1, "images or frames per model call: more is faster on a GPU; a stream waits for a whole "
                           "batch (default: 1)")
    vid_stride: int = option(1, "videos and streams: every N-th frame, the others skipped undecoded (default: 1)")
    save_crop: bool = option(False, "write each detection's crop to crops/<class>/<image>.jpg (default: off)")
    save_frames: bool = option(False, "videos and streams: each annotated frame as an image too, "
                                      "<stem>_frames/<stem>_<n>.jpg (default: off)")
    line_width: int | None = option(None, "with --save: box lines in pixels (default: scaled to the image)")
    show_labels: bool = option(True, "with --save: each box's class name (default: on)")
    show_conf: bool = option(True, "with --save: each box's score (default: on)")
    device: str = option("", "cpu, cuda, cuda:N or N (default: cuda if available, else cpu)")
    half: bool = option(False, ".pt: FP16 weights + CUDA graphs on CUDA, BF16 on CPUs with native BF16, else FP32 "
                               "(default: off)")
    augment: bool = option(False, "test-time augmentation: each batch also run flipped at 0.83 of its size and at 0.67,"
                                  " one NMS over the three (Ultralytics' augment=True; ~2.1x the time) (default: off)")
    end_to_end: bool = option(False, END_TO_END_HELP)
    verbose: bool = option(True, "print a line per image or frame and one at the end (default: on)")
    project: Path = option(Path("runs/predict"), "parent folder of runs (default: runs/predict)")
    name: str = option("exp", "run folder; exp, exp2, ... when taken (default: exp)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not str(self.source).strip():  # Path("") is "." : it read every image under the working folder
            raise ValueError("--source is empty: give an image, folder, glob, video, webcam index or URL")
        at_least(("--batch", self.batch, 1), ("--vid-stride", self.vid_stride, 1),
                 *([("--line-width", self.line_width, 1)] if self.line_width is not None else []))
        check_detection_flags(conf=self.conf, iou=self.iou, max_det=self.max_det, imgsz=self.imgsz)
        check_end_to_end(self.end_to_end, augment=self.augment)


@dataclass(kw_only=True)
class ExportOptions(Options):
    """The flags of ``python export.py`` / ``python -m detector export``."""

    weights: Path | None = option(None, "checkpoint .pt (default: the newest runs/train/*/weights/best.pt)")
    format: str = option("onnx", "onnx, engine, pt2 (AOTInductor; needs a C++ compiler), or several: onnx,pt2 "
                                 "(default: onnx)")
    half: bool = option(False, "FP16 convolutions (pt2: FP16 on CUDA, BF16 on a CPU with native BF16); "
                               "inputs/outputs stay FP32 (default: off)")
    imgsz: int | None = option(None, "square input size, a multiple of 32 (default: the training size, else "
                                     f"{DEFAULT_IMGSZ})")
    batch: int = option(1, "batch size; with --dynamic the largest TensorRT batch (default: 1)")
    dynamic: bool = option(False, "free batch, height and width; a pt2 package's batch alone (default: off, fixed "
                                  "shape)")
    opset: int = option(DEFAULT_OPSET, f"ONNX opset (default: {DEFAULT_OPSET})")
    simplify: bool = option(False, "slim the ONNX graph with onnxslim (default: off)")
    nms: bool = option(False, "NMS inside the graph, one class per box: outputs detections + num_detections "
                              "(default: off)")
    conf: float = option(EXPORT_CONF, f"with --nms: score threshold (default: {EXPORT_CONF})")
    iou: float = option(EXPORT_IOU, f"with --nms: IoU threshold (default: {EXPORT_IOU})")
    max_det: int = option(EXPORT_MAX_DET, f"with --nms: K, detections per image (default: {EXPORT_MAX_DET})")
    end_to_end: bool = option(False, "YOLO26 only: export its NMS-free one-to-one head; the file says so in its "
                                     "metadata and predict/val/benchmark take each image's best (box, class) pairs "
                                     "from it, no NMS; with --nms the graph ends in that top-k instead of NMS "
                                     "(default: off, the usual head)")
    data: Path | None = option(None, "dataset YAML: check parity on its val split, with mAP (default: synthetic "
                                     "images, no mAP)")
    datasets_dir: Path | None = option(None, "with --data: root of downloaded datasets (default: $DETECTOR_DATASETS, "
                                             "else datasets/ in the data folder)")
    no_check: bool = option(False, "skip the parity check (default: check)")
    map_margin: float = option(0.5, "with --data: largest allowed mAP50-95 drop in points (default: 0.5)")
    score_tol: float = option(SCORE_TOLERANCE,
                              f"without --data: largest allowed score difference (default: {SCORE_TOLERANCE})")
    workers: int = option(2, "with --data: data-loading processes for the check (default: 2)")
    device: str = option("", "cpu, cuda or cuda:N: device for tracing and the check (default: cuda if available, "
                             "else cpu)")
    workspace: float = option(DEFAULT_WORKSPACE_GIB, f"TensorRT workspace in GiB (default: {DEFAULT_WORKSPACE_GIB})")

    def __post_init__(self) -> None:
        super().__post_init__()
        parse_formats(self.format)  # --format is free text ("onnx,engine"): refused here, before any work
        check_detection_flags(conf=self.conf, iou=self.iou, max_det=self.max_det, imgsz=self.imgsz)
        at_least(("--workers", self.workers, 0))


def check_end_to_end(end_to_end: bool, *, augment: bool) -> None:
    """``ValueError`` for ``--end-to-end`` with a flag it cannot go with: test-time augmentation merges its views'
    boxes with NMS, which an end-to-end run has none of."""
    if end_to_end and augment:
        raise ValueError("--augment merges its three views' boxes with NMS and --end-to-end runs without NMS: "
                         "drop one")


def check_detection_flags(*, conf: float, iou: float, max_det: int, imgsz: int | None) -> None:
    """``ValueError`` naming the flag for a threshold outside 0..1 (``--conf 25`` meant 0.25: no box passes it,
    and the run said nothing), ``--max-det`` below 1 or ``--imgsz`` below 1, as Ultralytics' settings check
    refuses them."""
    for flag, value in (("--conf", conf), ("--iou", iou)):
        if not 0 <= value <= 1:
            raise ValueError(f"{flag} must be between 0 and 1; got {value}")
    at_least(("--max-det", max_det, 1), *([("--imgsz", imgsz, 1)] if imgsz is not None else []))


# Ultralytics' export formats that are not built here, and what to do instead (one line each).
OTHER_FORMATS = {
    "torchscript": "TorchScript is deprecated in PyTorch (torch.jit.save says so in 2.11 and 2.14); --format pt2 is its "
                   "torch.export successor, a package that runs without the model's Python code",
    **{name: "not built here: --format onnx, then convert the ONNX file with that toolkit (OpenVINO reads ONNX as "
             "it is)" for name in ("openvino", "coreml", "saved_model", "pb", "tflite", "edgetpu", "tfjs", "paddle",
                                   "mnn", "ncnn", "imx", "rknn", "executorch")},
}


def parse_formats(text: str) -> list[str]:
    """``--format`` text -> the formats it names, in order, each once: ``"ENGINE, onnx,engine"`` ->
    ``["engine", "onnx"]``; ``ValueError`` naming the flag for an unknown or empty one, and for one of Ultralytics'
    other formats what to do instead."""
    for name in (part.strip().lower() for part in text.split(",")):
        if name in OTHER_FORMATS:
            raise ValueError(f"--format {name}: {OTHER_FORMATS[name]}")
    return comma_separated(text, "--format", EXPORT_FORMAT, required=True)


def comma_separated(text: str, flag: str, choices: tuple[str, ...], *, required: bool = False) -> list[str]:
    """A comma-separated flag's text -> the values it names, lower-cased, in order, each once; ``ValueError``
    naming the flag for a value not in ``choices`` (or for none at all, when ``required``)."""
    values = list(dict.fromkeys(part.strip().lower() for part in text.split(",") if part.strip()))
    if any(value not in choices for value in values) or (required and not values):
        raise ValueError(f"{flag} {text!r}: choose from {', '.join(choices)} (comma-separated)")
    return values


@dataclass(kw_only=True)
class BenchmarkOptions(Options):
    """The flags of ``python -m detector benchmark``."""

    weights: Path | None = option(None, ".pt (all backends) or one .onnx/.engine/.pt2 (default: the newest "
                                        "runs/train/*/weights/best.pt)")
    imgsz: int | None = option(None, f"input size for .pt weights (default: the training size, else {DEFAULT_IMGSZ})")
    batch: int = option(1, "images per call for the latency columns (default: 1)")
    throughput_batch: int = option(32, "images per call for the throughput column; 0 = no throughput (default: 32)")
    runs: int = option(20, "timed batches per backend for latency (default: 20)")
    throughput_runs: int = option(5, "timed batches per backend for throughput (default: 5)")
    warmup: int = option(3, "untimed batches first (default: 3)")
    rounds: int = option(5, "the timed batches are spread over this many rounds, each round timing every backend in "
                            "turn, so that the machine's drift slows them all alike (default: 5)")
    skip: str = option("", f"comma-separated backends not to time: {', '.join(BENCHMARK_SKIP)} (default: none; "
                           "pt2 compiles for minutes on a small CPU)")
    device: str = option("", "cpu or cuda (default: cuda if available, else cpu)")
    end_to_end: bool = option(False, "YOLO26 only: time its NMS-free one-to-one head with the top-k postprocess "
                                     "(.pt: every backend exported so; an export: one made with --end-to-end) "
                                     "(default: off, the usual head with NMS)")

    def __post_init__(self) -> None:
        super().__post_init__()
        skipped(self.skip)  # refused here, before any work
        at_least(("--runs", self.runs, 1), ("--throughput-runs", self.throughput_runs, 1), ("--rounds", self.rounds, 1),
                 ("--batch", self.batch, 1), ("--throughput-batch", self.throughput_batch, 0),
                 ("--warmup", self.warmup, 0))


def at_least(*checks: tuple[str, int, int]) -> None:
    """``ValueError`` naming the first ``(flag, value, lowest)`` whose value is below its lowest."""
    for flag, value, lowest in checks:
        if value < lowest:
            raise ValueError(f"{flag} must be at least {lowest}; got {value}")


def skipped(text: str) -> set[str]:
    """``--skip`` text -> the backend kinds it names; ``ValueError`` naming the flag for an unknown one."""
    return set(comma_separated(text, "--skip", BENCHMARK_SKIP))


DEFAULT_ITERATIONS = 300  # Ultralytics' model.tune default: a script moves over unchanged


@dataclass(kw_only=True)
class TuneOptions(Options):
    """The flags of ``python -m detector tune`` that are its own; every other flag is train's, for each iteration."""

    # 300 as Ultralytics' model.tune: a script moves over unchanged. A tune is meant to be stopped (Ctrl-C) when its
    # best stops improving: every finished iteration is on disk, and --resume continues.
    iterations: int | None = option(None, "training runs to evolve the hyperparameters over, the first training the "
                                          f"given values (default: {DEFAULT_ITERATIONS}; with --resume, the count the "
                                          "tune was started with)")
    space: Path | None = option(None, "search space YAML, 'name: [low, high]' or '[low, high, gain]' per line, our "
                                      "names or Ultralytics' (default: Ultralytics 8.4's space, the settings it tunes "
                                      "that this trainer has)")
    project: Path = option(Path("runs/tune"), "parent folder of tune folders")
    name: str = option("exp", "tune folder name (a number is appended if it exists)")
    resume: bool = option(False, "continue the tune in --project/--name from its next iteration, with the settings "
                                 "it recorded")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.iterations is not None:
            at_least(("--iterations", self.iterations, 1))
        if problem := name_problem(self.name):  # before any training, not when the folder is claimed
            raise ValueError(problem)
