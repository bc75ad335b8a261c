"""Pretrained weights from other projects: find the file, read it safely, map it onto our model."""

from detector.weights.locate import resolve_weights
from detector.weights.safe_pickle import UnsafeCheckpointError
from detector.weights.ultralytics import (
    LoadReport,
    UltralyticsCheckpoint,
    convert_yolov8_state_dict,
    detect_yolov8_scale,
    load_pretrained,
    read_ultralytics_checkpoint,
)

__all__ = [
    "LoadReport",
    "UltralyticsCheckpoint",
    "UnsafeCheckpointError",
    "convert_yolov8_state_dict",
    "detect_yolov8_scale",
    "load_pretrained",
    "read_ultralytics_checkpoint",
    "resolve_weights",
]
