"""detector: an Apache-2.0, anchor-free YOLO-style object-detection trainer."""

__version__ = "0.1.0"
