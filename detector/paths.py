"""Where detector keeps what it downloads or generates: one data folder, never the installed package.

The data folder (:func:`data_home`) holds ``datasets/`` (downloads and the built-in shapes set) and
``weights/`` (pretrained files). It is, first to last:

1. ``$DETECTOR_HOME``;
2. in a source checkout (the folder holding ``detector/`` also holds ``pyproject.toml`` and ``train.py``),
   the checkout itself: ``make train`` and the tests keep writing ``datasets/`` and ``weights/`` beside the
   code, where ``make clean`` finds them;
3. the user's data folder: ``$XDG_DATA_HOME/detector``, else ``~/.local/share/detector`` (on macOS
   ``~/Library/Application Support/detector``, on Windows ``%LOCALAPPDATA%\\detector``), the places
   ``platformdirs.user_data_dir`` names; ten lines here rather than a dependency.

A wheel's package folder may be read-only or shared by several users, so nothing is ever written there.
Flags (``--datasets-dir``, ``--weights-dir``) and ``$DETECTOR_DATASETS`` override the parts.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HOME_ENV = "DETECTOR_HOME"
PACKAGE_DIR = Path(__file__).resolve().parent
CHECKOUT_MARKERS = ("pyproject.toml", "train.py")  # a wheel installs neither beside the package


def source_checkout() -> Path | None:
    """The repository folder when ``detector`` is imported from a checkout (editable installs too), else None."""
    root = PACKAGE_DIR.parent
    return root if all((root / marker).is_file() for marker in CHECKOUT_MARKERS) else None


def user_data_dir(app: str = "detector") -> Path:
    """The per-user data folder for ``app`` (``~/.local/share/detector`` on Linux); not created here."""
    if xdg := os.environ.get("XDG_DATA_HOME"):
        return Path(xdg).expanduser() / app
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local") / app
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / app
    return Path.home() / ".local" / "share" / app


def data_home() -> Path:
    """``$DETECTOR_HOME``, else the source checkout, else :func:`user_data_dir` (absolute; not created here)."""
    chosen = os.environ.get(HOME_ENV) or source_checkout() or user_data_dir()
    return Path(chosen).expanduser().absolute()


def default_weights_dir() -> Path:
    """Where ``download yolov8n`` writes and ``--weights yolov8n.pt`` looks: ``<data home>/weights``."""
    return data_home() / "weights"


def default_datasets_dir() -> Path:
    """The datasets root when neither ``--datasets-dir`` nor ``$DETECTOR_DATASETS`` names one."""
    return data_home() / "datasets"
