"""The graph-key count without a GPU: the label-only split gives the boxes the real one does, and the count adds up."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))  # the script imports its neighbour checkout.py

from benchmarks.graph_keys import label_only, simulate  # noqa: E402
from detector.data.synthetic import generate_shapes  # noqa: E402
from detector.training.builders import build_data  # noqa: E402
from detector.training.config import TrainConfig  # noqa: E402


def test_the_label_only_split_draws_the_same_boxes_and_every_step_is_counted(tmp_path: Path):
    data = generate_shapes(tmp_path, train=12, val=4, size=96)
    config = TrainConfig(data=str(data), imgsz=96, batch=4, epochs=3, close_mosaic=1, cache="none",
                         device="cpu").with_defaults()
    _, real, _ = build_data(config, with_val=False, device=torch.device("cuda"))  # the CUDA path: no CUDA needed
    _, split, _ = build_data(config, with_val=False, device=torch.device("cuda"))
    label_only(split, config.imgsz)
    keys = [(index, epoch, mosaic) for index in range(12) for epoch in (0, 1) for mosaic in (True, False)]
    for key in keys:  # boxes, classes and their order, with and without mosaic, in two epochs' draws
        assert torch.equal(real.dataset[key][1], split.dataset[key][1]), key
    tallies = simulate(config, split, [0, 1 << 40])
    for per_epoch in tallies.values():
        assert [tally["steps"] for tally in per_epoch] == [3, 3, 3]
        assert all(tally["eager"] + tally["capture"] + tally["replay"] == 3 for tally in per_epoch)
        assert sum(tally["new keys"] for tally in per_epoch) >= 1
    assert sum(t["padded"] for t in tallies[0]) == 0  # each batch's own power of two: nothing padded
