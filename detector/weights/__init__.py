"""Pretrained weights from other projects: find the file, read it safely, map it onto our model.

The names below are imported on first use: the readers import torch, and ``python -m detector download --help``
lists :mod:`detector.weights.catalog` without it (importing any module of this package runs this file first).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from detector.weights.locate import resolve_weights
    from detector.weights.safe_pickle import UnsafeCheckpointError
    from detector.weights.ultralytics import (
        LoadReport,
        UltralyticsCheckpoint,
        convert_state_dict,
        detect_scale,
        load_pretrained,
        read_ultralytics_checkpoint,
    )

__all__ = [
    "LoadReport",
    "UltralyticsCheckpoint",
    "UnsafeCheckpointError",
    "convert_state_dict",
    "detect_scale",
    "load_pretrained",
    "read_ultralytics_checkpoint",
    "resolve_weights",
]
_ELSEWHERE = {"resolve_weights": "locate", "UnsafeCheckpointError": "safe_pickle"}  # the others: ultralytics
# The names these had while only YOLOv8 loaded: kept so that code importing them goes on working.
_RENAMED = {"convert_yolov8_state_dict": "convert_state_dict", "detect_yolov8_scale": "detect_scale"}


def __getattr__(name: str) -> Any:
    name = _RENAMED.get(name, name)
    if name in __all__:
        module = _ELSEWHERE.get(name, "ultralytics")
        return getattr(importlib.import_module(f"detector.weights.{module}"), name)
    raise AttributeError(f"module 'detector.weights' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
