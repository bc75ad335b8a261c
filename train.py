"""Train a detector: ``python train.py --data my.yaml`` (no --data: the built-in shapes dataset)."""

from detector.cli import exit_with
from detector.cli.train import main

if __name__ == "__main__":
    exit_with(main())
