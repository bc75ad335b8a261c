"""train.py's flags: the Ultralytics spellings fill the same config fields as ours."""

from __future__ import annotations

from detector.cli.train import build_parser


def test_val_period_is_val_interval() -> None:
    parser = build_parser()
    assert parser.parse_args([]).val_interval == 1  # the alias leaves the config default alone
    assert parser.parse_args(["--val-period", "5"]).val_interval == 5
    assert parser.parse_args(["--val-interval", "3"]).val_interval == 3
    assert parser.parse_args(["--img", "416"]).imgsz == 416
