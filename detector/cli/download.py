"""``python -m detector download NAME``: fetch a dataset into the datasets root (detector/data/download.py)."""

from __future__ import annotations

import argparse
import sys

from detector.data.catalog import DOWNLOADS, datasets_root
from detector.data.download import DownloadError, download
from detector.data.spec import DatasetError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m detector download",
        description="Fetch a dataset into the datasets root (explicit: nothing in detector downloads by itself).",
    )
    parser.add_argument("name", type=str.lower, choices=sorted(DOWNLOADS), help="dataset to fetch")
    parser.add_argument("--split", choices=("all", "val"), default="all",
                        help="val: only what the val split needs "
                             "(COCO: annotations + val2017, 1.1 GB; VOC: the 2007 test zip)")
    parser.add_argument("--datasets-dir", default="", help="datasets root; default $DETECTOR_DATASETS, else ./datasets")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    root = datasets_root(args.datasets_dir or None)
    try:
        download(args.name, root=root, split=args.split)
    except (DownloadError, DatasetError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\nerror: interrupted; run the command again to resume (partial files in {root})", file=sys.stderr)
        return 130
    return 0
