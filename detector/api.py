"""The five verbs from Python: ``from detector import train, val, predict, export, load``.

Each takes the command's flags as keyword arguments, spelled as Python names (``--max-det`` -> ``max_det``,
``--no-plots`` -> ``plots=False``), and runs the same code as the command (``detector/cli/*.py``)::

    from detector import train, val, predict, load

    run = train(data="coco128", model="n", epochs=10, imgsz=320)          # {"metrics", "run_dir", "best", ...}
    metrics = val(weights=run["best"], data="coco128")                    # {"mAP50-95": ..., "mAP50": ...}
    for image in predict("photos/", weights=run["best"], conf=0.3):       # one dict per image
        print(image["file"], image["boxes"], image["scores"], image["labels"])
    model = load(run["best"])                                             # loaded once, run many times
    results = model.predict("photos/cat.jpg")

Arguments are checked by the command's own parser: an unknown name or a bad value raises ``TypeError`` /
``ValueError`` in one line instead of exiting. Errors the command prints as ``error: ...`` are raised.
Only heavy modules are imported when a verb runs, so ``import detector`` stays cheap.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from detector.inference import Backend

__all__ = ["Model", "export", "load", "predict", "train", "val"]


def _option(parser: argparse.ArgumentParser, name: str) -> argparse.Action:
    """The optional argument a keyword names: ``max_det`` -> ``--max-det`` (else any flag with that dest)."""
    flag = "--" + name.replace("_", "-")
    actions = [a for a in parser._actions if a.option_strings and a.help is not argparse.SUPPRESS]
    for action in actions:
        if flag in action.option_strings:
            return action
    for action in actions:
        if action.dest == name:
            return action
    known = sorted(a.dest for a in actions if a.dest != "help")
    raise TypeError(f"{parser.prog}: unknown argument {name!r}; known: {', '.join(known)}")


def to_argv(parser: argparse.ArgumentParser, kwargs: dict[str, Any]) -> list[str]:
    """Keyword arguments -> the command line that means the same: ``{"max_det": 5, "plots": False}`` ->
    ``["--max-det", "5", "--no-plots"]``. ``None`` leaves a flag at its default; lists are joined by commas."""
    argv: list[str] = []
    for name, value in kwargs.items():
        action = _option(parser, name)
        flag = next(s for s in action.option_strings if s.startswith("--"))
        if value is None:
            continue
        if isinstance(action, argparse.BooleanOptionalAction):
            argv.append(flag if value else "--no-" + flag[2:])
        elif action.nargs == 0:  # store_true / store_false
            if bool(value) != bool(action.default):
                argv.append(flag)
        else:
            text = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
            argv += [flag, text]
    return argv


def parse(parser: argparse.ArgumentParser, kwargs: dict[str, Any]) -> argparse.Namespace:
    """Parse ``kwargs`` with the command's parser; its errors raise ``ValueError`` instead of exiting."""

    def fail(message: str) -> None:
        raise ValueError(f"{parser.prog}: {message}")

    parser.error = fail  # type: ignore[method-assign]  # this parser instance only
    return parser.parse_args(to_argv(parser, kwargs))


def _no_onednn_misses() -> None:
    from detector.tuning import enlarge_onednn_cache

    enlarge_onednn_cache()  # before the first convolution, as the commands do: see detector/tuning.py


def train(**kwargs: Any) -> dict[str, Any]:
    """``python train.py`` with ``kwargs`` as its flags (``data="coco128", epochs=10, ...``).

    Returns ``{"metrics" (last evaluation), "run_dir", "best" (path of best.pt), "seconds", "epochs_done",
    "precision", "interrupted"}``.
    """
    from detector.cli.train import build_parser, run_train

    summary = run_train(parse(build_parser(), kwargs))
    return {**summary, "best": Path(summary["run_dir"]) / "weights" / "best.pt"}


def val(**kwargs: Any) -> dict[str, float]:
    """``python -m detector val`` with ``kwargs`` as its flags (``weights=..., data=...``); returns the metrics
    (``mAP50-95``, ``mAP50``, ``mAP75``, ...). The table, plots and predictions.json are written as by the command."""
    from detector.cli.val import build_parser, run_val

    if isinstance(kwargs.get("weights"), Model):
        kwargs["weights"] = kwargs["weights"].weights
    _no_onednn_misses()
    return run_val(parse(build_parser(), kwargs))


def predict(source: str | Path | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    """``python -m detector predict`` with ``kwargs`` as its flags; ``weights`` may also be a :func:`load` ed model.

    Returns one dict per image (or video frame): ``{"file", "frame", "boxes"`` float32 ``[N, 4]`` xyxy pixels of
    the original image, ``"scores"`` float32 ``[N]``, ``"labels"`` int64 ``[N]`` (numpy), ``"names"}``.
    Unlike the command, nothing is written unless ``save=True`` (annotated images and predictions.json).
    """
    from detector.cli.predict import build_parser, run_predict

    if source is not None:
        kwargs["source"] = source
    model = kwargs.pop("weights", None)
    if model is not None and not isinstance(model, Model):
        kwargs["weights"] = model
    _no_onednn_misses()
    args = parse(build_parser(), kwargs)
    return run_predict(args, backend=model.backend if isinstance(model, Model) else None, write=False)


def export(**kwargs: Any) -> list[Path]:
    """``python export.py`` with ``kwargs`` as its flags (``weights=..., format="onnx", ...``); returns the
    files written, after their parity check."""
    from detector.cli.export import build_parser, run_export

    if isinstance(kwargs.get("weights"), Model):
        kwargs["weights"] = kwargs["weights"].weights
    _no_onednn_misses()
    return run_export(parse(build_parser(), kwargs))


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
