"""The five verbs from Python: ``from detector import train, val, predict, export, load``.

Each takes the command's flags as keyword arguments, spelled as Python names (``--max-det`` -> ``max_det``,
``--no-plots`` -> ``plots=False``), and runs the same workflow as the command (``detector/workflows``)::

    from detector import train, val, predict, load

    run = train(data="coco128", model="n", epochs=10, imgsz=320)          # {"metrics", "run_dir", "best", ...}
    metrics = val(weights=run["best"], data="coco128")                    # {"mAP50-95": ..., "mAP50": ...}
    for image in predict("photos/", weights=run["best"], conf=0.3):       # one dict per image
        print(image["file"], image["boxes"], image["scores"], image["labels"])
    model = load(run["best"])                                             # loaded once, run many times
    results = model.predict("photos/cat.jpg")

The keyword arguments become the command's option object directly (``val(**kwargs)`` ->
:class:`detector.workflows.val.ValOptions`, ``train`` -> :class:`detector.training.config.TrainConfig`): no
command line in between. ``None`` leaves an argument at its
default; an unknown or missing name raises ``TypeError``, a bad value ``ValueError``, in one line naming it.
Errors the command prints as ``error: ...`` are raised. Only heavy modules are imported when a verb runs, so
``import detector`` stays cheap.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from detector.inference import Backend

__all__ = ["Model", "export", "load", "predict", "train", "val"]


def _weights_file(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``weights=`` a :func:`load` ed model -> the file it came from (val and export read the file themselves)."""
    if isinstance(kwargs.get("weights"), Model):
        kwargs["weights"] = kwargs["weights"].weights
    return kwargs


def train(**kwargs: Any) -> dict[str, Any]:
    """``python train.py`` with ``kwargs`` as its flags (``data="coco128", epochs=10, ...``).

    Returns ``{"metrics" (last evaluation), "run_dir", "best" (path of best.pt), "seconds", "epochs_done",
    "precision", "interrupted"}``.
    """
    from detector.training.config import TrainConfig
    from detector.training.trainer import train as run_training
    from detector.options import build_options

    summary = run_training(build_options(TrainConfig, kwargs, command="train"))
    return {**summary, "best": Path(summary["run_dir"]) / "weights" / "best.pt"}


def val(**kwargs: Any) -> dict[str, float]:
    """``python -m detector val`` with ``kwargs`` as its flags (``weights=..., data=...``); returns the metrics
    (``mAP50-95``, ``mAP50``, ``mAP75``, ...). The table, plots and predictions.json are written as by the command."""
    from detector.options import build_options
    from detector.workflows.val import ValOptions, run_val

    return run_val(build_options(ValOptions, _weights_file(kwargs), command="val"))


def predict(source: str | Path | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    """``python -m detector predict`` with ``kwargs`` as its flags; ``weights`` may also be a :func:`load` ed model.

    Returns one dict per image (or video frame): ``{"file", "frame", "boxes"`` float32 ``[N, 4]`` xyxy pixels of
    the original image, ``"scores"`` float32 ``[N]``, ``"labels"`` int64 ``[N]`` (numpy), ``"names"}``.
    Unlike the command, nothing is written unless ``save=True`` (annotated images and predictions.json).
    """
    from detector.options import build_options
    from detector.workflows.predict import PredictOptions, run_predict

    if source is not None:
        kwargs["source"] = source
    model = kwargs.pop("weights", None)
    if model is not None and not isinstance(model, Model):
        kwargs["weights"] = model
    options = build_options(PredictOptions, kwargs, command="predict")
    return run_predict(options, backend=model.backend if isinstance(model, Model) else None, write=False)


def export(**kwargs: Any) -> list[Path]:
    """``python export.py`` with ``kwargs`` as its flags (``weights=..., format="onnx", ...``); returns the
    files written, after their parity check."""
    from detector.workflows.export import ExportOptions, run_export
    from detector.options import build_options

    return run_export(build_options(ExportOptions, _weights_file(kwargs), command="export"))


@dataclass
class Model:
    """A model loaded once (:func:`load`): ``.pt`` in PyTorch, ``.onnx`` in ONNX Runtime, ``.engine`` in TensorRT.

    Attributes:
        weights: the file it came from.
        backend: the runtime (:class:`detector.inference.Backend`); ``backend.info.names`` are the classes.
    """

    weights: Path
    backend: Backend

    @property
    def names(self) -> list[str]:
        return list(self.backend.info.names)

    def predict(self, source: str | Path, **kwargs: Any) -> list[dict[str, Any]]:
        """:func:`predict` with this model: the same flags, the same results."""
        return predict(source, weights=self, **kwargs)


def load(weights: str | Path, *, device: str = "", imgsz: int | None = None) -> Model:
    """Load ``weights`` (a training checkpoint, full or stripped, or an export) for :meth:`Model.predict`.

    ``device``: ``cpu``, ``cuda`` or ``cuda:N`` (default: CUDA when there is one); ``imgsz``: the input size of a
    ``.pt`` model (default: its training size).
    """
    from detector.device import resolve_device
    from detector.inference import load_backend

    path = Path(weights)
    return Model(path, load_backend(path, device=str(resolve_device(device)), imgsz=imgsz))
