"""detector: an Apache-2.0, anchor-free YOLO-style object-detection trainer.

The Python API (detector/api.py)::

    from detector import train, val, predict, export, load

Those names are imported on first use, so ``import detector`` stays cheap (no torch).
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["__version__", "export", "load", "predict", "train", "val"]
_API = ("export", "load", "predict", "train", "val")

if TYPE_CHECKING:
    from detector.api import export, load, predict, train, val


def __getattr__(name: str) -> Any:
    if name in _API:
        return getattr(importlib.import_module("detector.api"), name)
    raise AttributeError(f"module 'detector' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})


class _Package(types.ModuleType):
    """``detector.export`` is both the API's function and a subpackage (detector/export/). Importing a subpackage
    sets it as an attribute of its parent, which would replace the function once anything imported
    ``detector.export.*``. This property keeps the function and ignores that assignment; the subpackage stays
    importable (``from detector.export import ModelInfo`` reads ``sys.modules``)."""

    @property
    def export(self) -> Any:
        return __getattr__("export")

    @export.setter
    def export(self, subpackage: types.ModuleType) -> None:
        pass


sys.modules[__name__].__class__ = _Package
