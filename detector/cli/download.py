"""``python -m detector download NAME``: fetch a dataset into the datasets root (detector/data/download.py), or
pretrained weights into the weights folder (detector/weights/download.py); both default to the data folder of
detector/paths.py."""

from __future__ import annotations

import argparse
from pathlib import Path

from detector.cli.errors import run_command
from detector.cli.parser import CommandParser
from detector.data.catalog import DOWNLOADS, datasets_root
from detector.weights.catalog import PRETRAINED, pretrained_name
from detector.paths import HOME_ENV, default_weights_dir
from detector.signals import Terminated, sigterm_as_ctrl_c


def _name(text: str) -> str:
    """Case-free; ``yolov8n.pt`` is accepted for ``yolov8n``, and a dataset's YAML (``coco.yaml``, ``VOC.yaml``) for
    the dataset, as ``--data`` takes them."""
    return pretrained_name(text) or text.strip().lower().removesuffix(".yaml")


PROG = "python -m detector download"  # detector.cli.main passes how the command was started


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = CommandParser(
        prog=prog,
        description="Fetch a dataset into the datasets root, or Ultralytics' YOLOv8, YOLO11 or YOLO26 detection "
                    "weights into the weights folder (explicit: nothing in detector downloads by itself).",
        epilog="Every file is fetched over https (see --allow-http), capped in bytes fetched and unpacked, and checked "
               "against the SHA-256 pinned in detector's catalog (COCO: its published MD5; coco128, VOC and "
               "Ultralytics' small sets have none pinned: size and zip CRCs, with a warning). Weights are then read "
               "through detector's restricted unpickler. They are AGPL-3.0, not Apache-2.0 (see weights/README.md). "
               "$DETECTOR_DOWNLOAD_URL fetches every file from that base URL (a mirror); the same checks apply. See "
               "docs/security.md.",
    )
    parser.add_argument("name", type=_name, choices=sorted(DOWNLOADS) + sorted(PRETRAINED),
                        help="dataset, any case (coco, coco128, voc; Ultralytics' small sets: coco8, brain-tumor, "
                             "medical-pills, signature, african-wildlife, construction-ppe, HomeObjects-3K, kitti; "
                             "coco.yaml, VOC.yaml ... also work), or weights (yolov8n ... yolov8x, "
                             "yolo11n ... yolo11x, yolo26n ... yolo26x; yolov8n.pt also works)")
    parser.add_argument("--split", choices=("all", "val"), default="all",
                        help="datasets: val: only what the val split needs "
                             "(COCO: annotations + val2017, 1.1 GB; VOC: the 2007 test zip) (default: all)")
    parser.add_argument("--datasets-dir", default="",
                        help=f"datasets root; default $DETECTOR_DATASETS, else ${HOME_ENV}/datasets (in a checkout: "
                             f"its datasets/; installed: ~/.local/share/detector/datasets)")
    parser.add_argument("--weights-dir", type=Path, default=None,
                        help=f"weights: folder to write into; default where --weights yolov8n.pt looks: "
                             f"${HOME_ENV}/weights (in a checkout: its weights/; installed: "
                             f"~/.local/share/detector/weights)")
    parser.add_argument("--allow-http", action="store_true",
                        help="accept plain http URLs (COCO's own host, or an http mirror); digests are checked all the "
                             "same (default: https only)")
    return parser


def fetch(args: argparse.Namespace) -> None:
    """Download what ``args.name`` names: weights into ``--weights-dir``, a dataset into the datasets root."""
    weights = args.name in PRETRAINED
    where = (args.weights_dir or default_weights_dir()) if weights else datasets_root(args.datasets_dir or None)
    try:
        # SIGTERM unwinds: Python leaves it fatal, which skipped the finally that removes an extraction's
        # staging folder (tens of GB for COCO) and the lock.
        with sigterm_as_ctrl_c():
            if weights:
                from detector.weights.download import download_weights  # imports torch: only for weights

                download_weights(args.name, weights_dir=where, allow_http=args.allow_http)
            else:
                from detector.data.download import download  # imports OpenCV (~0.4 s): not for --help

                download(args.name, root=where, split=args.split, allow_http=args.allow_http)
    except KeyboardInterrupt as interrupt:
        # run_command prints this instead of a bare 'interrupted' (exit 130, 143 when terminated): a second run
        # resumes the download.
        what = "terminated (SIGTERM)" if isinstance(interrupt, Terminated) else "interrupted"
        raise type(interrupt)(f"{what}; run the command again to resume (partial files in {where})") from None


def main(argv: list[str] | None = None, *, prog: str = PROG) -> int:
    return run_command(fetch, build_parser(prog).parse_args(argv))
