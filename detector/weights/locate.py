"""Find a weights file by path or by bare name in the weights folder (``<data home>/weights``, detector/paths.py)."""

from __future__ import annotations

import shlex
from pathlib import Path

from detector.aliases import other_ultralytics_family
from detector.paths import default_weights_dir
from detector.weights.catalog import pretrained_name


def is_bare_name(name_or_path: str | Path) -> bool:
    """Whether ``name_or_path`` is a file name alone (``yolo11n.pt``), which the weights folder is searched for."""
    return Path(name_or_path).expanduser().name == str(name_or_path)


def resolve_weights(name_or_path: str | Path, *, weights_dir: Path | None = None) -> Path:
    """An existing file wins; otherwise a bare name (``"yolov8n.pt"``) is looked up in ``weights_dir``.

    ``weights_dir`` defaults to :func:`detector.paths.default_weights_dir`: ``weights/`` in a source checkout,
    else ``$DETECTOR_HOME/weights`` or the user's data folder (``~/.local/share/detector/weights``), read when
    called. Nothing is downloaded here: ``python -m detector download yolo11n`` fetches the catalogued files
    (:mod:`detector.weights.catalog`); the error for a missing one names that command.

    Raises:
        FileNotFoundError: one line saying where we looked.
    """
    default = default_weights_dir()
    weights_dir = weights_dir or default
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    bare = is_bare_name(name_or_path)
    if bare and (weights_dir / path.name).is_file():
        return weights_dir / path.name
    looked = f"{path.resolve()} or {weights_dir / path.name}" if bare else str(path.resolve())
    if bare and (name := pretrained_name(path.name)):
        hint = f"fetch it: python -m detector download {name}"
        if weights_dir.resolve() != default.resolve():
            hint += f" --weights-dir {shlex.quote(str(weights_dir))}"  # a copy-paste command: quote spaces
    elif path.suffix.lower() in (".yaml", ".yml"):  # an architecture file: "obtain it by hand" sent users astray
        family = other_ultralytics_family(path.name)
        hint = (f"{family} is not built here: only YOLOv8, YOLO11 and YOLO26 detection are (--model n ... x, "
                "11n ... 11x, 26n ... 26x)" if family else "a .yaml names an architecture, not weights: --model "
                "n ... x, 11n ... 11x or 26n ... 26x (or model=yolov8n.yaml, model=yolo11n.yaml, model=yolo26n.yaml) "
                "trains from scratch")
    elif bare and (family := other_ultralytics_family(path.name)):
        hint = (f"{family} weights would not load here either: only YOLOv8, YOLO11 and YOLO26 detection weights are "
                "(yolov8n.pt ... yolov8x.pt, yolo11n.pt ... yolo11x.pt, yolo26n.pt ... yolo26x.pt; python -m "
                "detector download yolo26n)")
    else:
        hint = f"obtain the file by hand and put it in {weights_dir}"
    raise FileNotFoundError(f"weights {str(name_or_path)!r} not found (looked for {looked}); {hint}")


def located(name_or_path: str | Path) -> Path:
    """``--weights`` for val, predict, export and benchmark as training finds it: a bare name of a file in the
    weights folder (``yolov8n.pt``, where ``download`` puts it) is that file, a missing catalogued name says how
    to fetch it and another Ultralytics family's (``yolo26n.pt``) that it cannot load (:func:`resolve_weights`).
    Anything else comes back as given, for the caller's own checks."""
    path = Path(name_or_path).expanduser()
    if path.is_file() or not is_bare_name(name_or_path):
        return path
    if (default_weights_dir() / path.name).is_file() or pretrained_name(path.name) or other_ultralytics_family(
            path.name):
        return resolve_weights(path.name)  # found there, or one line: how to fetch it, or that it cannot load
    return path
