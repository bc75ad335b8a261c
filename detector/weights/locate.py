"""Find a weights file by path or by bare name in the repository's ``weights/`` folder."""

from __future__ import annotations

from pathlib import Path

from detector.weights.catalog import pretrained_name

# <repo>/detector/weights/locate.py -> <repo>/weights
WEIGHTS_DIR = Path(__file__).resolve().parents[2] / "weights"


def resolve_weights(name_or_path: str | Path, *, weights_dir: Path = WEIGHTS_DIR) -> Path:
    """An existing file wins; otherwise a bare name (``"yolov8n.pt"``) is looked up in ``weights_dir``.

    Nothing is downloaded here: ``python -m detector download yolov8n`` fetches the catalogued files
    (:mod:`detector.weights.catalog`); the error for a missing one names that command.

    Raises:
        FileNotFoundError: one line saying where we looked.
    """
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    is_bare_name = path.name == str(name_or_path)
    if is_bare_name and (weights_dir / path.name).is_file():
        return weights_dir / path.name
    looked = f"{path.resolve()} or {weights_dir / path.name}" if is_bare_name else str(path.resolve())
    if is_bare_name and (name := pretrained_name(path.name)):
        hint = f"fetch it: python -m detector download {name}"
        if weights_dir.resolve() != WEIGHTS_DIR.resolve():
            hint += f" --weights-dir {weights_dir}"
    else:
        hint = f"obtain the file by hand and put it in {weights_dir} (see weights/README.md)"
    raise FileNotFoundError(f"weights {str(name_or_path)!r} not found (looked for {looked}); {hint}")
