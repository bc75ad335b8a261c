"""Train a detector: ``python train.py --data my.yaml`` (no --data: the built-in shapes dataset)."""

import sys

from detector.cli.train import main

if __name__ == "__main__":
    sys.exit(main())
