"""The network: building blocks, backbone + neck, and the decoupled detection head."""

from detector.model.yolo import INPUT_MULTIPLE, SCALES, YOLO, build_model, image_size_problem

__all__ = ["INPUT_MULTIPLE", "SCALES", "YOLO", "build_model", "image_size_problem"]
