"""The network: building blocks, backbone + neck, and the decoupled detection head."""

from detector.model.yolo import SCALES, YOLO, build_model

__all__ = ["SCALES", "YOLO", "build_model"]
