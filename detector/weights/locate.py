"""Find a weights file by path or by bare name in the weights folder (``<data home>/weights``, detector/paths.py)."""

from __future__ import annotations

from pathlib import Path

from detector.paths import default_weights_dir
from detector.weights.catalog import pretrained_name


def resolve_weights(name_or_path: str | Path, *, weights_dir: Path | None = None) -> Path:
    """An existing file wins; otherwise a bare name (``"yolov8n.pt"``) is looked up in ``weights_dir``.

    ``weights_dir`` defaults to :func:`detector.paths.default_weights_dir`: ``weights/`` in a source checkout,
    else ``$DETECTOR_HOME/weights`` or the user's data folder (``~/.local/share/detector/weights``), read when
    called. Nothing is downloaded here: ``python -m detector download yolov8n`` fetches the catalogued files
    (:mod:`detector.weights.catalog`); the error for a missing one names that command.

    Raises:
        FileNotFoundError: one line saying where we looked.
    """
    default = default_weights_dir()
    weights_dir = weights_dir or default
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    is_bare_name = path.name == str(name_or_path)
    if is_bare_name and (weights_dir / path.name).is_file():
        return weights_dir / path.name
    looked = f"{path.resolve()} or {weights_dir / path.name}" if is_bare_name else str(path.resolve())
    if is_bare_name and (name := pretrained_name(path.name)):
        hint = f"fetch it: python -m detector download {name}"
        if weights_dir.resolve() != default.resolve():
            hint += f" --weights-dir {weights_dir}"
    else:
        hint = f"obtain the file by hand and put it in {weights_dir}"
    raise FileNotFoundError(f"weights {str(name_or_path)!r} not found (looked for {looked}); {hint}")
