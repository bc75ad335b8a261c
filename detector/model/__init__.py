"""The network: building blocks, backbone + neck, and the decoupled detection head."""

from detector.architecture import MODEL_NAMES
from detector.model.yolo import INPUT_MULTIPLE, SCALES, YOLO, build_model, image_size_problem

# SCALES: YOLOv8's scale letters and multipliers; MODEL_NAMES: every model build_model takes (YOLO11's "11n" ...)
__all__ = ["INPUT_MULTIPLE", "MODEL_NAMES", "SCALES", "YOLO", "build_model", "image_size_problem"]
