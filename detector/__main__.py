"""``python -m detector <command>``: train, val, predict, benchmark, export, ablate-amp, download."""

from __future__ import annotations

import importlib
import sys

# command -> (module, help). Each module exposes ``main(argv: list[str] | None) -> int``.
COMMANDS = {
    "train": ("detector.cli", "train a detector (same as train.py)"),
    "val": ("detector.val", "evaluate a checkpoint: per-class table + pycocotools summary"),
    "predict": ("detector.predict", "run a .pt/.onnx/.engine model on images, folders or videos"),
    "benchmark": ("detector.benchmark", "time pre-process / inference / post-process per backend"),
    "export": ("detector.export.cli", "export to ONNX / TensorRT (same as export.py)"),
    "ablate-amp": ("detector.ablate", "train with AMP and with --unamp, and report the difference"),
    "download": ("detector.data.download", "fetch a dataset (coco, coco128) into the datasets root"),
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


if __name__ == "__main__":
    sys.exit(main())
