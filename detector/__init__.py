"""detector: an Apache-2.0, anchor-free YOLO-style object-detection trainer."""

from detector.runtime import enlarge_onednn_cache

__version__ = "0.1.0"

enlarge_onednn_cache()  # before any convolution runs: see detector/runtime.py
