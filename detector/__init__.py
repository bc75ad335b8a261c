"""detector: an Apache-2.0, anchor-free YOLO-style object-detection trainer.

The Python API (detector/api.py)::

    from detector import train, val, predict, export, load, tune

Those names are imported on first use, so ``import detector`` stays cheap (no torch). No subpackage shares a
name with them (training lives in ``detector.training``, export formats in ``detector.exporting``): importing
a subpackage sets it as an attribute of this package, which would shadow the function of the same name.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from detector.version import __version__

__all__ = ["__version__", "export", "load", "predict", "train", "tune", "val"]
_API = ("export", "load", "predict", "train", "tune", "val")

if TYPE_CHECKING:
    from detector.api import export, load, predict, train, tune, val


def __getattr__(name: str) -> Any:
    if name in _API:
        return getattr(importlib.import_module("detector.api"), name)
    raise AttributeError(f"module 'detector' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})
