"""The verbs from Python: ``from detector import train, val, predict, export, load, tune``.

Each takes its command's flags as named, typed, defaulted parameters, spelled as Python names (``--max-det`` ->
``max_det``, ``--no-plots`` -> ``plots=False``), so an editor and ``help()`` show them; each runs the same
workflow as the command (``detector/workflows``)::

    from detector import train, val, predict, load

    run = train(data="coco128", model="n", epochs=10, imgsz=320)          # {"metrics", "run_dir", "best", ...}
    metrics = val(weights=run["best"], data="coco128")     # {"mAP50-95": ..., "mAP50": ..., "P": ..., "R": ...}
    for image in predict("photos/", weights=run["best"], conf=0.3):       # one dict per image
        print(image["file"], image["boxes"], image["scores"], image["labels"])
    for frame in predict("clip.mp4", weights=run["best"], stream=True):   # a generator: constant memory
        ...
    model = load(run["best"])                                             # loaded once, run many times
    results = model.predict(cv2.imread("cat.jpg"))                        # arrays are BGR, as OpenCV reads them

The parameters become the command's option object (``val(...)`` -> :class:`detector.workflows.options.ValOptions`,
``train`` -> :class:`detector.training.config.TrainConfig`): no command line in between. Their names, defaults
and types are those classes' fields (``tests/test_api.py`` fails if they drift apart); the annotations also
admit a ``Path`` where the field is text. ``None`` leaves an argument at its default.

Ultralytics' names are accepted as well, through the same table as the commands' ``key=value`` arguments
(:mod:`detector.aliases`): ``train(model="yolov8n.pt", amp=False, cos_lr=True)`` is
``train(weights="yolov8n.pt", model="n", precision="fp32", cosine=True)``, and says so in one line per alias.
An unknown name raises ``TypeError`` (as does an Ultralytics setting we have no equivalent for, naming what we do
instead), a bad value ``ValueError``, in one line. Errors the command prints as ``error: ...`` are raised. Only
heavy modules are imported when a verb runs, so ``import detector`` stays cheap.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    from PIL import Image

    from detector.inference import Backend

__all__ = ["Model", "export", "load", "predict", "train", "tune", "val"]


def train(
    *,
    data: str | Path = "",
    datasets_dir: str | Path = "",
    fraction: float = 1.0,
    single_cls: bool = False,
    classes: list[int] | tuple[int, ...] | None = None,
    model: str = "n",
    weights: str | Path = "",
    freeze: int = 0,
    imgsz: int = 0,
    epochs: int = 0,
    time: str | float = "",
    batch: int = 16,
    batch_memory: float = 0.6,
    workers: int = -1,
    cache: str | bool = "auto",
    device: str | int = "",
    seed: int = 0,
    precision: str = "auto",
    unamp: bool = False,
    channels_last: bool = True,
    cuda_graphs: str = "auto",
    cudnn_benchmark: str = "auto",
    recompute: str = "auto",
    optimizer: str = "auto",
    lr0: float = 0.01,
    lrf: float = 0.01,
    cosine: bool = False,
    momentum: float = 0.937,
    weight_decay: float = 0.0005,
    nominal_batch: int = 64,
    warmup_epochs: float = 3.0,
    warmup_bias_lr: float = 0.1,
    warmup_momentum: float = 0.8,
    clip_grad: float = 10.0,
    ema_decay: float = 0.9999,
    box_gain: float = 7.5,
    cls_gain: float = 0.5,
    dfl_gain: float = 1.5,
    cls_pw: float = 0.0,
    assigner_topk: int = 10,
    assigner_alpha: float = 0.5,
    assigner_beta: float = 6.0,
    mosaic: float = 1.0,
    close_mosaic: int = 10,
    mixup: float = 0.0,
    cutmix: float = 0.0,
    degrees: float = 0.0,
    translate: float = 0.1,
    scale: float = 0.5,
    shear: float = 0.0,
    perspective: float = 0.0,
    hsv_h: float = 0.015,
    hsv_s: float = 0.7,
    hsv_v: float = 0.4,
    fliplr: float = 0.5,
    flipud: float = 0.0,
    bgr: float = 0.0,
    albumentations: float = 0.01,
    pixel_augment: str = "auto",
    rect: bool = False,
    multi_scale: bool | float = True,
    multi_scale_min: float = 0.875,
    multi_scale_max: float = 1.125,
    multi_scale_hold: int = 10,
    val_interval: int = 1,
    patience: int = 100,
    val_conf: float = 0.001,
    val_iou: float = 0.7,
    max_det: int = 300,
    val_rect: bool = True,
    coco_eval: str = "faster",
    val_background: str = "auto",
    final_fp32: bool = False,
    plots: bool = True,
    tensorboard: bool = False,
    project: str | Path = "runs/train",
    name: str = "exp",
    save_period: int = 0,
    resume: str | Path | bool = "",
    amp_check: bool = True,
    sync_bn: bool = False,
    **ultralytics: Any,
) -> dict[str, Any]:
    """Train a detector: ``python train.py`` with these flags (``python train.py --help`` describes each).

    Common ones: ``data`` (a data YAML, a shipped name such as ``"coco128"``; empty: the built-in shapes set),
    ``model`` (``n``...``x``, ``11n``...``11x``, or an Ultralytics ``"yolo11n.pt"``: its weights and model),
    ``weights`` (start from a ``.pt``), ``epochs``, ``imgsz``, ``batch``, ``time`` (a wall-clock budget such as
    ``"1h"``), ``freeze`` (layers ``0..N-1``, numbered as Ultralytics does, stay fixed), ``device``,
    ``project``/``name`` (the run folder).

    Returns ``{"metrics" (last evaluation), "run_dir" (absolute), "best" (path of best.pt), "seconds", "epochs_done",
    "precision", "interrupted"}``.
    """
    from detector.training.config import TrainConfig
    from detector.training.trainer import train as run_training

    summary = run_training(_options(TrainConfig, "train", given(train, locals()), ultralytics))
    return {**summary, "best": Path(summary["run_dir"]) / "weights" / "best.pt"}


def val(
    *,
    weights: str | Path | Model | None = None,
    data: str | Path | None = None,
    datasets_dir: str | Path | None = None,
    imgsz: int | None = None,
    batch: int = 32,
    workers: int = 2,
    conf: float = 0.001,
    iou: float = 0.7,
    max_det: int = 300,
    rect: bool = True,
    split: str = "val",
    coco_eval: str = "faster",
    device: str | int = "",
    fp32: bool = False,
    half: bool = False,
    augment: bool = False,
    end_to_end: bool = False,
    plots: bool = True,
    verbose: bool = True,
    project: str | Path = Path("runs/val"),
    name: str = "exp",
    **ultralytics: Any,
) -> dict[str, float]:
    """Score ``weights`` (our ``.pt``, an Ultralytics ``yolov8*.pt`` or ``yolo11*.pt``, an ``.onnx`` or ``.engine``, or
    a :func:`load` ed model) on a split of ``data``: ``python -m detector val`` with these flags.

    Returns the metrics (``mAP50-95``, ``mAP50``, ``mAP75``, ...). The table, plots and predictions.json are
    written under ``project/name`` as by the command; ``verbose=False`` prints no table (results.txt has it).
    ``weights`` is required (``None`` here only so that Ultralytics' ``model=`` can stand for it); without ``data``
    a checkpoint of ours is scored on the dataset it trained on, as Ultralytics' ``val`` does. ``augment``:
    test-time augmentation (three views of each image, one NMS; about 2.1x the time). ``end_to_end``: a YOLO26
    model's NMS-free one-to-one head and its top-k (Ultralytics' ``nms=False``); refused for any other model.
    """
    from detector.workflows.options import ValOptions
    from detector.workflows.val import run_val

    return run_val(_options(ValOptions, "val", weights_file(given(val, locals())), ultralytics))


def predict(
    source: str | Path | int | np.ndarray | Image.Image | list | tuple | None = None,
    *,
    weights: str | Path | Model | None = None,
    save: bool = False,
    save_txt: bool = False,
    save_conf: bool = False,
    classes: int | list[int] | tuple[int, ...] | None = None,
    conf: float = 0.25,
    iou: float = 0.7,
    max_det: int = 300,
    agnostic_nms: bool = False,
    imgsz: int | None = None,
    batch: int = 1,
    vid_stride: int = 1,
    save_crop: bool = False,
    save_frames: bool = False,
    line_width: int | None = None,
    show_labels: bool = True,
    show_conf: bool = True,
    device: str | int = "",
    half: bool = False,
    augment: bool = False,
    end_to_end: bool = False,
    verbose: bool = True,
    project: str | Path = Path("runs/predict"),
    name: str = "exp",
    stream: bool = False,
    **ultralytics: Any,
) -> list[dict[str, Any]] | Iterator[dict[str, Any]]:
    """Detect objects in ``source``: ``python -m detector predict`` with these flags.

    ``source``: an image, video or folder path (searched recursively), a glob (``"imgs/*.jpg"``), a webcam index
    (``0``), a stream URL (``rtsp://``, ``http://``), a NumPy array (``uint8 [H, W, 3]`` **BGR**, as
    ``cv2.imread`` gives), a PIL image, or a list of any of these. ``weights`` may be a :func:`load` ed model.
    ``classes`` keeps only those class ids; ``agnostic_nms`` suppresses overlaps across classes; ``vid_stride``
    takes every N-th frame of a video or stream. ``save`` writes annotated images or videos (``line_width``,
    ``show_labels``, ``show_conf`` as Ultralytics'), ``save_txt`` YOLO labels (``save_conf`` adds scores),
    ``save_crop`` each box's crop, ``save_frames`` each annotated video frame as an image; unlike the command,
    nothing is written unless one of them is set. ``batch`` images or frames go through the model per call (faster
    on a GPU; a stream waits for a whole batch).
    ``augment``: test-time augmentation (three views of each image, one NMS; about 2.1x the time).
    ``end_to_end``: a YOLO26 model's NMS-free one-to-one head, each image's best ``max_det`` (box, class) pairs
    above ``conf`` (Ultralytics' ``nms=False``; a loaded model takes it at :func:`load`).
    ``verbose=False`` prints nothing but warnings and notes (a line per image otherwise).

    Returns one dict per image or video frame: ``{"file", "frame"`` (None for images), ``"boxes"`` float32
    ``[N, 4]`` xyxy pixels of the original image, ``"scores"`` float32 ``[N]``, ``"labels"`` int64 ``[N]``
    (numpy), ``"names"}``: a list, or with ``stream=True`` a generator that runs as it is read (each result also
    holding its frame as ``"image"``, RGB ``uint8 [H, W, 3]``), so a long video or a webcam runs in constant
    memory.
    """
    from detector.workflows.options import PredictOptions
    from detector.workflows.predict import run_predict

    values = given(predict, locals())
    model = values.pop("weights", None)
    if model is not None and not isinstance(model, Model):
        values["weights"] = model
    text_source = source is None or isinstance(source, (str, Path, int)) and not isinstance(source, bool)
    values["source"] = None if source is None else str(source) if text_source else f"<{type(source).__name__}>"
    options = _options(PredictOptions, "predict", values, ultralytics)
    return run_predict(options, backend=model.backend if isinstance(model, Model) else None, write=False,
                       source=None if text_source else source, stream=stream)


def export(
    *,
    weights: str | Path | Model | None = None,
    format: str | list[str] = "onnx",
    half: bool = False,
    imgsz: int | None = None,
    batch: int = 1,
    dynamic: bool = False,
    opset: int = 17,
    simplify: bool = False,
    nms: bool = False,
    conf: float = 0.25,
    iou: float = 0.7,
    max_det: int = 300,
    end_to_end: bool = False,
    data: str | Path | None = None,
    datasets_dir: str | Path | None = None,
    no_check: bool = False,
    map_margin: float = 0.5,
    score_tol: float = 0.05,
    workers: int = 2,
    device: str | int = "",
    workspace: float = 4.0,
    **ultralytics: Any,
) -> list[Path]:
    """Export ``weights`` (default: the newest ``runs/train/*/weights/best.pt``) to ONNX and/or TensorRT
    (``format="onnx"``, ``"engine"`` or ``"onnx,engine"``): ``python export.py`` with these flags.

    Returns the files written, after their parity check against the FP32 PyTorch model. ``end_to_end`` (YOLO26
    only): the NMS-free one-to-one head, recorded in the file's metadata (with ``nms``, a top-k in the graph).
    """
    from detector.workflows.export import run_export
    from detector.workflows.options import ExportOptions

    return run_export(_options(ExportOptions, "export", weights_file(given(export, locals())), ultralytics))


def tune(
    *,
    iterations: int | None = None,
    space: str | Path | dict[str, Any] | None = None,
    project: str | Path = Path("runs/tune"),
    name: str = "exp",
    resume: bool = False,
    **train_settings: Any,
) -> dict[str, float | int]:
    """Evolve training's hyperparameters (``python -m detector tune``), as Ultralytics' ``model.tune(data=...,
    epochs=30, iterations=300)``: each iteration trains with settings mutated from the fittest so far.

    ``train_settings``: :func:`train`'s keywords (our names or Ultralytics'), the same for every iteration, checked
    once before the first: ``data``, ``epochs``, ``imgsz``, ``model``, ``seed``... ``space``: a search space
    ``{"lr0": (1e-5, 1e-2), "momentum": (0.7, 0.98, 0.3)}`` or a YAML file of one (default: Ultralytics 8.4's, the
    settings it tunes that this trainer has). ``iterations``: 300 by default, as Ultralytics'; ``resume``: continue
    the tune in ``project/name`` (to the iterations it was started with, unless given).

    Returns the fittest iteration's hyperparameters (our names); ``project/name`` holds tune_results.csv,
    best_hyperparameters.yaml and that iteration's weights.
    """
    from detector.options import build_options
    from detector.training.config import TrainConfig
    from detector.workflows.options import TuneOptions
    from detector.workflows.tune import run_tune

    if "save" in train_settings:  # Ultralytics' own tune example passes save=False
        print(f"note: Ultralytics' save={train_settings.pop('save')} is not needed here: a tune deletes each "
              "iteration's weights once it is recorded, keeping the fittest's", file=sys.stderr)
    values = given(tune, locals())
    space_values = values.pop("space") if isinstance(values.get("space"), dict) else None
    options = build_options(TuneOptions, values, command="tune")
    config = _options(TrainConfig, "train", {}, train_settings)
    return run_tune(options, config, space_values)


def given(function: Callable, values: dict[str, Any]) -> dict[str, Any]:
    """The keyword parameters of ``function`` that ``values`` (its ``locals()``) sets to other than the default."""
    changed = {}
    for name, parameter in inspect.signature(function).parameters.items():
        if parameter.kind is not parameter.KEYWORD_ONLY or name not in values:
            continue
        value, default = values[name], parameter.default
        try:
            same = value is default or (type(value) is type(default) and bool(value == default))
        except (TypeError, ValueError):  # an array compares element-wise
            same = False
        if not same and name != "stream":
            changed[name] = value
    return changed


def _options(options_class: type, command: str, values: dict[str, Any], ultralytics: dict[str, Any]) -> Any:
    """Ultralytics' names translated (one note each), then the option object, checked; one-line errors."""
    from detector.aliases import translate
    from detector.options import build_options

    return build_options(options_class, translate(command, {**values, **ultralytics}), command=command)


def weights_file(values: dict[str, Any]) -> dict[str, Any]:
    """``weights=`` a :func:`load` ed model -> the file it came from (val and export read the file themselves)."""
    model = values.get("weights")
    if isinstance(model, Model):
        # A bare name given to load() goes on as that name, so that export() of load("yolov8n.pt") writes into the
        # current folder as export(weights="yolov8n.pt") does (workflows.export.export_folder), not into the
        # weights folder the name was found in.
        from detector.weights.locate import is_bare_name

        bare = model.given is not None and is_bare_name(model.given)
        values["weights"] = model.given if bare else model.weights
    return values


@dataclass
class Model:
    """A model loaded once (:func:`load`): ``.pt`` in PyTorch, ``.onnx`` in ONNX Runtime, ``.engine`` in TensorRT.

    Attributes:
        weights: the file it came from.
        backend: the runtime (:class:`detector.inference.Backend`); ``backend.info.names`` are the classes.
    """

    weights: Path
    backend: Backend
    given: Path | None = field(default=None, repr=False)  # the name load() was given (a bare yolov8n.pt)

    @property
    def names(self) -> list[str]:
        return list(self.backend.info.names)

    def predict(self, source: Any, *, stream: bool = False, **flags: Any) -> list[dict[str, Any]] | Iterator[dict]:
        """:func:`predict` with this model: the same sources and flags, the same results."""
        return predict(source, weights=self, stream=stream, **flags)

    def __call__(self, source: Any, *, stream: bool = False, **flags: Any) -> list[dict[str, Any]] | Iterator[dict]:
        """``model(source)``: :meth:`predict`, as an Ultralytics model called on a source predicts."""
        return self.predict(source, stream=stream, **flags)


def load(weights: str | Path, *, device: str = "", imgsz: int | None = None, half: bool = False,
         end_to_end: bool = False) -> Model:
    """Load ``weights`` (a training checkpoint, full or stripped, Ultralytics ``yolov8*.pt`` or ``yolo11*.pt``, or an
    export) for
    :meth:`Model.predict`.

    ``device``: ``cpu``, ``cuda`` or ``cuda:N`` (default: CUDA when there is one); ``imgsz``: the input size of a
    ``.pt`` model (default: its training size); ``half``: a ``.pt`` model in FP16 on CUDA, BF16 on a CPU with
    native BF16 (as ``predict --half``); ``end_to_end``: a YOLO26 model's NMS-free one-to-one head (as ``predict
    --end-to-end``; an export made with it runs so anyway). A loaded model's ``predict`` takes neither ``device`` nor
    ``half``, nor ``end_to_end`` unless it loaded so.
    """
    from detector.postprocess import NMSConfig
    from detector.device import resolve_device
    from detector.inference import load_backend
    from detector.inference.torch_backend import half_precision
    from detector.weights.locate import located
    from detector.workflows.predict import input_size

    path, resolved = located(weights), resolve_device(device)  # yolov8n.pt: the weights folder's
    precision = half_precision(resolved) if half else "fp32"
    backend = load_backend(path, device=str(resolved), imgsz=imgsz, precision=precision,
                           nms=NMSConfig(end_to_end=end_to_end))
    input_size(backend, imgsz)  # here, not at the first call: an imgsz of 100 or one a fixed export cannot take
    return Model(path, backend, Path(weights))
