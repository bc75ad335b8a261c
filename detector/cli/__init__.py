"""Every command in one place: ``python -m detector <command>`` and the ``detector`` console script.

``train.py`` and ``export.py`` call the ``train`` and ``export`` commands' ``main`` directly.
"""

from __future__ import annotations

import importlib
import sys

# command -> (module, help). Each module exposes ``main(argv: list[str] | None) -> int`` and is imported only
# when its command runs, so ``--help`` stays instant.
COMMANDS = {
    "train": ("detector.cli.train", "train a detector (same as train.py)"),
    "val": ("detector.cli.val", "evaluate a checkpoint: per-class table + pycocotools summary"),
    "predict": ("detector.cli.predict", "run a .pt/.onnx/.engine model on images, folders or videos"),
    "benchmark": ("detector.cli.benchmark", "time pre-process / inference / post-process per backend"),
    "export": ("detector.cli.export", "export to ONNX / TensorRT (same as export.py)"),
    "ablate-amp": ("detector.cli.ablate", "train with AMP and with --unamp, and report the difference"),
    "download": ("detector.cli.download", "fetch a dataset (coco, coco128, voc) or YOLOv8 weights (yolov8n...x)"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print("usage: python -m detector <command> [options]\n\ncommands:")
        for name, (_, text) in COMMANDS.items():
            print(f"  {name:<11} {text}")
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    module = importlib.import_module(COMMANDS[argv[0]][0])
    return int(module.main(argv[1:]) or 0)
