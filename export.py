"""Export a trained checkpoint to ONNX / TensorRT: ``python export.py --weights runs/train/exp/weights/best.pt``.

Thin entry point; the logic (and ``--help``) lives in :mod:`detector.cli.export`.
"""

from detector.cli import exit_with
from detector.cli.export import main

if __name__ == "__main__":
    exit_with(main())
