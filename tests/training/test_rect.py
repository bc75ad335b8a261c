"""--rect (detector/training/rect.py): rectangular training batches end to end, what they turn off, and the step's
input at a batch's canvas."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
import yaml

from detector.data.synthetic import make_image
from detector.training.config import TrainConfig
from detector.training.rect import augment_placement, cuda_graphs_choice, rect_notes
from detector.training.step_input import resize_batch, sized_shape, step_input
from detector.training.trainer import Trainer, train
from tests.conftest import NAMES

# (height, width) of the training images: aspect ratios 0.5, 1 and 2, so that at 64 px and batch 4 the batches
# have three canvases (32x64, 64x64, 64x32), and one image more than two batches (a partial one, filled).
TRAIN_HW = [(32, 64)] * 4 + [(64, 64)] * 2 + [(64, 32)] * 3


def write_mixed_dataset(root: Path) -> Path:
    """Synthetic shapes resized to :data:`TRAIN_HW` (train) and three of them (val), YOLO labels; the data YAML."""
    rng = np.random.default_rng(0)
    for split, shapes in (("train", TRAIN_HW), ("val", TRAIN_HW[::4])):
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        for index, (height, width) in enumerate(shapes):
            image, labels = make_image(rng, 64)
            cv2.imwrite(str(root / "images" / split / f"{index}.png"), cv2.resize(image, (width, height)))
            rows = "".join(f"{int(row[0])} {' '.join(f'{value:.6f}' for value in row[1:])}\n" for row in labels)
            (root / "labels" / split / f"{index}.txt").write_text(rows)
    (root / "data.yaml").write_text(f"path: .\ntrain: images/train\nval: images/val\nnames: {NAMES}\n")
    return root / "data.yaml"


def _config(data: Path, project: Path, **overrides) -> TrainConfig:
    values = dict(data=str(data), device="cpu", imgsz=64, epochs=2, batch=4, workers=0, cache="ram",
                  project=str(project), name="run", plots=False, amp_check=False, close_mosaic=1, seed=0,
                  warmup_epochs=0.5, rect=True, mixup=0.1)
    values.update(overrides)
    return TrainConfig(**values)


def test_a_rect_run_trains_at_its_canvases_says_what_it_turned_off_and_resumes(tmp_path: Path, capsys,
                                                                               watchdog) -> None:
    """Two epochs at three canvases (RAM cache), the notes and the header; then a run stopped after its first epoch
    resumes from last.pt with the disk cache (which --resume may change) and finishes the second. ``watchdog``: a
    hang ends the test run after 120 s with every thread's traceback."""
    data = write_mixed_dataset(tmp_path / "data")
    trainer = Trainer(_config(data, tmp_path / "a", plots=True), progress=False)
    assert trainer.input_shapes() == [(4, 32, 64), (4, 64, 32), (4, 64, 64)] and len(trainer.train_loader) == 3
    summary = trainer.fit()
    rows = list(csv.DictReader((summary["run_dir"] / "results.csv").open()))
    assert [row["epoch"] for row in rows] == ["1", "2"]
    assert all(math.isfinite(float(row[key])) for row in rows for key in ("train/box", "train/cls", "train/dfl"))
    assert all(int(row["optimizer_steps"]) >= 1 for row in rows)
    printed = capsys.readouterr().out
    assert ("note: --rect trains without mosaic, MixUp and CutMix (--mosaic 1, --mixup 0.1 off): each item is its "
            "own image in its batch's canvas") in printed
    assert "multi-scale" not in "".join(line for line in printed.splitlines() if line.startswith("note: --rect"))
    assert ("| rectangular batches (--rect): 3 canvases of height x width 32x64, 64x32, 64x64 at --imgsz 64, the "
            "batches' order shuffled every epoch, no mosaic; multi-scale 64 px only (no other multiple of 32 in range; "
            "no mosaic and 64 px for the last 1 epochs): 3 input shapes (each canvas's long side) |") in printed
    assert "MixUp" not in printed.split("| rectangular")[0].split("augmentation in the workers")[1]  # none mixed
    resolved = yaml.safe_load((summary["run_dir"] / "resolved.yaml").read_text())
    assert (resolved["rect"], resolved["multi_scale"], resolved["mosaic"], resolved["pixel_augment"]) == (
        True, True, 0.0, "workers")
    assert (summary["run_dir"] / "train_batch0.png").is_file()  # a rectangular batch, drawn
    # Stopped after epoch 1 (a loader worker making its batches), resumed: the run's own --rect (rect=False is
    # ignored, with a warning), epoch 2 from the disk cache.
    partial = train(_config(data, tmp_path / "b", workers=1), progress=False, stop_after_epochs=1)
    assert partial["epochs_done"] == 1
    resumed = train(_config(data, tmp_path / "b", rect=False, cache="disk",
                            resume=str(partial["run_dir"] / "weights" / "last.pt")), progress=False)
    assert resumed["epochs_done"] == 2 and resumed["run_dir"] == partial["run_dir"]
    rows = list(csv.DictReader((resumed["run_dir"] / "results.csv").open()))
    assert [row["epoch"] for row in rows] == ["1", "2"] and math.isfinite(float(rows[-1]["train/box"]))
    header = [line for line in capsys.readouterr().out.splitlines() if line.startswith("detector: ")][-1]
    assert "resumed at epoch 2 from" in header and "| rectangular batches (--rect): 3 canvases" in header
    assert "| disk cache " in header


def test_a_rect_run_with_multi_scale_trains_each_canvas_at_the_drawn_sizes(tmp_path: Path, monkeypatch,
                                                                          watchdog) -> None:
    """Multi-scale under --rect, as Ultralytics' multi_scale scales rect batches: each step's input is its batch's
    canvas with the long side at the step's drawn size, the other side rounded up to the stride; the run's input
    shapes (the header's count, cuDNN's) are every canvas at every size drawn, and the steps take some of each."""
    import detector.training.engine as engine

    taken, real = [], engine.step_input

    def recorded(*args, **kwargs) -> torch.Tensor:
        made = real(*args, **kwargs)
        taken.append(tuple(made.shape))
        return made

    monkeypatch.setattr(engine, "step_input", recorded)
    data = write_mixed_dataset(tmp_path / "data")
    trainer = Trainer(_config(data, tmp_path, multi_scale_min=0.5, multi_scale_max=1.5, multi_scale_hold=1,
                              close_mosaic=0, epochs=3), progress=False)
    sizes, planned = trainer.multi_scale.ladder(), set(trainer.input_shapes())
    assert sizes == [32, 64, 96] and planned <= {
        (4, *sized_shape(height, width, size)) for height, width in ((32, 64), (64, 32), (64, 64)) for size in sizes}
    assert (4, 64, 96) in planned and (4, 32, 32) in planned  # the 32x64 canvas at 96 and at 32 px
    trainer.fit()
    steps = {(batch, height, width) for batch, _, height, width in taken}
    assert steps <= planned and len(steps) > 3  # every step at a planned shape, and not the three canvases alone


def test_rect_turns_off_mixing_the_device_warp_and_cuda_graphs_with_a_note_each() -> None:
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    config = TrainConfig(rect=True, mosaic=1.0, cutmix=0.5, multi_scale=True, pixel_augment="auto", imgsz=320)
    notes = rect_notes(config, cuda, world_size=1)
    assert notes == [
        "note: --rect trains without mosaic, MixUp and CutMix (--mosaic 1, --cutmix 0.5 off): each item is its own "
        "image in its batch's canvas",
        "note: --rect warps in the loader workers: --pixel-augment auto runs as pixels (HSV and flips on the device)",
        "note: --rect turns CUDA graphs off: they are captured per input shape, and each canvas is one",
    ]
    assert (augment_placement(config, cuda), augment_placement(config, cpu)) == ("pixels", "workers")
    assert cuda_graphs_choice(config) == "off"
    # Only what the run would have done: on a CPU no graph and no device warp; nothing at all without --rect.
    quiet = TrainConfig(rect=True, mosaic=0.0, multi_scale=False, pixel_augment="workers")
    assert rect_notes(quiet, cpu, world_size=1) == [] and rect_notes(quiet, cuda, world_size=2) == []
    assert rect_notes(TrainConfig(), cuda, world_size=1) == []
    assert augment_placement(TrainConfig(), cuda) == "device" and cuda_graphs_choice(TrainConfig()) == "auto"


def test_a_rect_batch_is_the_step_s_input_at_its_canvas() -> None:
    """A --rect batch has its canvas's shape, long side --imgsz: at that size the step takes it as it is, with the
    pixel operations of --pixel-augment pixels applied; at another size multi-scale resizes it to a long side of that
    size, the other side rounded up to the stride, as Ultralytics' multi_scale does."""
    from detector.data.batch_augment import PixelOps

    batch = torch.randint(0, 256, (2, 3, 32, 64), dtype=torch.uint8)
    assert resize_batch(batch, 64) is batch and resize_batch(batch.transpose(2, 3), 64).shape == (2, 3, 64, 32)
    made = step_input(batch, 64, torch.device("cpu"), channels_last=True)
    assert made.shape == (2, 3, 32, 64) and torch.equal(made, batch.float() / 255)
    flipped = step_input(batch, 64, torch.device("cpu"), channels_last=True,
                         pixel_ops=[PixelOps(flip_lr=True), PixelOps()])
    assert torch.equal(flipped[0], made[0].flip(2)) and torch.equal(flipped[1], made[1])
    scaled = resize_batch(batch.float(), 96)  # 32 x 96 / 64 = 48, rounded up to 64
    assert torch.equal(scaled, torch.nn.functional.interpolate(batch.float(), size=(64, 96), mode="bilinear",
                                                               align_corners=False))
    assert resize_batch(batch, 32).shape == (2, 3, 32, 32) and resize_batch(batch, 160).shape == (2, 3, 96, 160)
    assert resize_batch(torch.zeros(1, 3, 64, 64), 96).shape == (1, 3, 96, 96)  # squares: multi-scale as before
    # Ultralytics' rule, ceil(side * size / long side / 32) * 32, at a 640x480 camera's canvas (480x640 at 640 px):
    assert [sized_shape(480, 640, size) for size in (576, 608, 640, 672, 704)] == [
        (448, 576), (480, 608), (480, 640), (512, 672), (544, 704)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the pixels path and the graphs' note")
def test_a_rect_run_on_cuda_takes_the_pixels_path_without_graphs(tmp_path: Path, capsys, watchdog) -> None:
    """On CUDA --pixel-augment auto would warp on the device, which renders squares: a --rect run takes ``pixels``
    (HSV and flips on the device, at each batch's canvas), runs its steps eagerly, and trains. No GPU has run --rect
    before this test; ``watchdog``: a hang ends the test run with every thread's traceback."""
    data = write_mixed_dataset(tmp_path / "data")
    summary = train(_config(data, tmp_path, device="cuda", epochs=1, mixup=0.0, amp_check=True), progress=False)
    rows = list(csv.DictReader((summary["run_dir"] / "results.csv").open()))
    assert len(rows) == 1 and math.isfinite(float(rows[0]["train/box"])) and int(rows[0]["optimizer_steps"]) >= 1
    assert int(rows[0].get("graph_captures") or 0) == 0  # eager: a graph per canvas would be captured otherwise
    resolved = yaml.safe_load((summary["run_dir"] / "resolved.yaml").read_text())
    assert (resolved["rect"], resolved["pixel_augment"]) == (True, "pixels")
    printed = capsys.readouterr().out
    assert "note: --rect warps in the loader workers: --pixel-augment auto runs as pixels" in printed
    assert "note: --rect turns CUDA graphs off" in printed
