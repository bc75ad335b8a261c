"""Validation batches: square letterboxes, or rectangular ones padded only to each batch's canvas."""

from __future__ import annotations

import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from detector.boxes import cxcywh_to_xyxy
from detector.data.build import SplitData, build_split
from detector.data.dataset import collate
from detector.data.letterbox import unletterbox_boxes
from detector.data.spec import load_dataset_spec
from detector.metrics.loop import Scoring, make_val_loader, run_validation

SIZE = 160
# (height, width) and YOLO rows: landscape, portrait and square images, so batches get different canvases.
IMAGES = [((96, 160), [(0, 0.5, 0.5, 0.4, 0.5)]), ((160, 96), [(1, 0.3, 0.6, 0.4, 0.2)]),
          ((120, 160), [(0, 0.25, 0.25, 0.2, 0.3), (1, 0.7, 0.7, 0.3, 0.3)]), ((160, 160), [(1, 0.5, 0.5, 0.5, 0.5)]),
          ((100, 160), [(0, 0.6, 0.4, 0.3, 0.4)])]


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> SplitData:
    return write_split(tmp_path_factory.mktemp("rect"))


def write_split(root: Path) -> SplitData:
    for folder in ("images/val", "labels/val"):
        (root / folder).mkdir(parents=True)
    for index, ((height, width), rows) in enumerate(IMAGES):
        cv2.imwrite(str(root / "images" / "val" / f"{index}.png"), np.full((height, width, 3), 60, np.uint8))
        lines = "".join(f"{c} {x} {y} {w} {h}\n" for c, x, y, w, h in rows)
        (root / "labels" / "val" / f"{index}.txt").write_text(lines)
    (root / "data.yaml").write_text("path: .\ntrain: images/val\nval: images/val\nnames: [a, b]\n")
    return build_split(load_dataset_spec(root / "data.yaml"), "val", image_size=SIZE, augment=None, cache="none")


def original_boxes(split: SplitData, image_id: int) -> torch.Tensor:
    index = int(np.flatnonzero(split.records.image_ids == image_id)[0])
    height, width = split.records.image_hw[index]
    labels = torch.from_numpy(split.records.labels_of(index)[:, 1:5].copy())
    return cxcywh_to_xyxy(labels) * torch.tensor([width, height, width, height], dtype=torch.float32)


def in_pixels(rows: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Target rows ``(image, class, cx, cy, w, h)`` normalised to a ``height x width`` input -> xyxy pixels."""
    return cxcywh_to_xyxy(rows[:, 2:6]) * torch.tensor([width, height, width, height], dtype=torch.float32)


@pytest.mark.parametrize("rect", [False, True])
def test_targets_and_metas_of_each_batch_map_back_to_the_ground_truth(split: SplitData, rect: bool):
    loader = make_val_loader(split, batch_size=2, workers=0, rect=rect)
    seen, shapes = [], []
    for images, targets, metas in loader:
        height, width = images.shape[-2:]
        shapes.append((height, width))
        assert height % 32 == 0 and width % 32 == 0 and max(height, width) == SIZE
        for position, meta in enumerate(metas):
            rows = targets[targets[:, 0] == position]
            boxes = in_pixels(rows, height, width)
            want = original_boxes(split, meta.image_id)
            # The boxes were scaled by the resized image's rounded sides, the undo divides by the exact ratio: up
            # to half a resized pixel per side, 0.5 / ratio original pixels (ratio 1 here), plus FP32 rounding.
            assert torch.allclose(unletterbox_boxes(boxes, meta), want, atol=0.5 / meta.ratio + 1e-3)
            seen.append(meta.image_id)
    assert sorted(seen) == sorted(split.records.image_ids.tolist())
    if rect:  # by aspect: the 96- and 100-row landscapes share 128 rows; 120 rows with the square: square; the portrait
        assert shapes == [(128, 160), (160, 160), (160, 96)]
    else:
        assert shapes == [(SIZE, SIZE)] * 3


def test_an_oracle_scores_the_same_on_rectangular_and_square_batches(split: SplitData):
    """An ``infer`` that returns the ground truth, placed in each batch's own input pixels: mAP 1 either way, so
    the detections come back to the original images' pixels from either letterbox."""
    for rect in (False, True):
        loader = make_val_loader(split, batch_size=2, workers=0, rect=rect)
        batches = list(loader)
        truth = iter(batches)

        def oracle(images: torch.Tensor) -> list[dict[str, torch.Tensor]]:
            _, targets, _ = next(truth)
            height, width = images.shape[-2:]
            out = []
            for position in range(len(images)):
                rows = targets[targets[:, 0] == position]
                boxes = in_pixels(rows, height, width)
                out.append({"boxes": boxes, "scores": torch.ones(len(rows)), "labels": rows[:, 1].long()})
            return out

        result = run_validation(oracle, split, batches, progress=False)
        assert result.metrics["mAP50-95"] == pytest.approx(1.0), rect
        # The pass's time by part: each measured, none negative, together the whole.
        assert set(result.parts) == {"loading", "inference", "scoring"} and min(result.parts.values()) >= 0
        assert sum(result.parts.values()) == pytest.approx(result.seconds) and result.parts["scoring"] > 0


def test_an_image_changed_since_the_scan_is_shrunk_into_its_batchs_canvas(tmp_path: Path):
    """The canvases come from the sizes the scan recorded; an image replaced since by a taller one still fits its
    batch (scaled down further), and its boxes still map back to its own pixels."""
    split = write_split(tmp_path)
    cv2.imwrite(str(tmp_path / "images" / "val" / "0.png"), np.full((160, 96, 3), 60, np.uint8))  # was 96 x 160
    seen = []
    for images, targets, metas in make_val_loader(split, batch_size=2, workers=0, rect=True):
        height, width = images.shape[-2:]
        for position, meta in enumerate(metas):
            if meta.image_id != 0:
                continue
            seen.append(meta.image_id)
            assert (height, width) == (128, 160) and meta.original_hw == (160, 96) and meta.ratio == 0.8
            rows = targets[targets[:, 0] == position]
            boxes = in_pixels(rows, height, width)
            label = torch.tensor([IMAGES[0][1][0][1:]])  # its label file still holds the old normalised box
            want = cxcywh_to_xyxy(label) * torch.tensor([96, 160, 96, 160])
            assert torch.allclose(unletterbox_boxes(boxes, meta), want, atol=0.5 / meta.ratio + 1e-3)
    assert seen == [0]


def test_the_ground_truth_fed_back_as_detections_scores_one_whatever_the_rounding(tmp_path: Path) -> None:
    """Each side of a resized image is rounded to whole pixels: a 100x67 image at 64 px is 64x43, a y scale of
    43/67 where the single ratio said 64/100. Boxes mapped back by the single ratio missed by up to half a pixel
    of the resize (coco128 at 320 px: mAP50-95 0.9924 for the ground truth itself); by each side's own scale they
    come back where they were."""
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        (tmp_path / "images" / split).mkdir(parents=True)
        (tmp_path / "labels" / split).mkdir(parents=True)
        for index, (height, width) in enumerate([(67, 100), (100, 67), (71, 93), (93, 59)]):
            cv2.imwrite(str(tmp_path / "images" / split / f"{index}.png"), rng.integers(0, 255, (height, width, 3),
                                                                                       dtype=np.uint8))
            rows = [f"{rng.integers(0, 2)} {cx:.6f} {cy:.6f} {w:.6f} {h:.6f}"
                    for cx, cy, w, h in rng.uniform([0.3, 0.3, 0.05, 0.05], [0.7, 0.7, 0.4, 0.4], (5, 4))]
            (tmp_path / "labels" / split / f"{index}.txt").write_text("\n".join(rows) + "\n")
    (tmp_path / "data.yaml").write_text("path: .\ntrain: images/train\nval: images/val\nnames: [a, b]\n")
    split_data = build_split(load_dataset_spec(tmp_path / "data.yaml"), "val", image_size=64, augment=None,
                             cache="none")
    for rect in (True, False):
        loader = make_val_loader(split_data, batch_size=2, workers=0, rect=rect)
        batches = list(loader)
        targets_of = iter(targets for _, targets, _ in batches)

        def infer(images: torch.Tensor) -> list[dict[str, torch.Tensor]]:
            targets, (height, width) = next(targets_of), images.shape[2:]
            found = []
            for image in range(images.shape[0]):
                rows = targets[targets[:, 0] == image]
                cx, cy, w, h = rows[:, 2] * width, rows[:, 3] * height, rows[:, 4] * width, rows[:, 5] * height
                boxes = torch.stack((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2), 1)
                found.append({"boxes": boxes, "scores": torch.ones(len(rows)), "labels": rows[:, 1].long()})
            return found

        metrics = run_validation(infer, split_data, batches, progress=False, scoring=Scoring("pycocotools")).metrics
        assert metrics["mAP50-95"] == pytest.approx(1.0, abs=1e-9), (rect, metrics)


@pytest.mark.parametrize("terminal", [False, True])
def test_the_val_bar_ends_its_line_in_a_log_and_vanishes_on_a_terminal(tiny_split, monkeypatch, terminal: bool):
    """In a log (training's output piped to a file) the bar's clearing left no newline: the "epoch N: mAP..." line
    printed next began after the bar's leftover, and ``grep '^epoch'`` on the log missed it."""
    import io

    class Stream(io.StringIO):
        def isatty(self) -> bool:
            return terminal

    stream = Stream()
    monkeypatch.setattr(sys, "stderr", stream)  # where tqdm writes
    batch = collate([tiny_split.dataset[i] for i in range(len(tiny_split.dataset))])
    empty = {"boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0, dtype=torch.long)}
    run_validation(lambda images: [empty] * len(images), tiny_split, [batch], progress=True)
    written = stream.getvalue()
    assert written.endswith("\r") if terminal else written.endswith("\n") and "val: 100%" in written.splitlines()[-1]


def test_a_pass_asked_for_p_and_r_scores_the_val_tables_all_row_beside_its_map(tiny_split) -> None:
    """Training's passes ask for the val table's mean P and R (results.csv's P and R): matched from the same
    detections as its mAP, to the bit of the table `detector val` prints; a pass that does not ask has none, and keeps
    no predictions for them unless asked to."""
    from detector.metrics.matching import validation_stats
    from tests.metrics.test_matching import noisy_predictions

    predictions = noisy_predictions(tiny_split)
    batches = list(make_val_loader(tiny_split, batch_size=4, workers=0, rect=False))
    assert [meta.image_id for meta in batches[0][2]] == [meta.image_id for _, meta in predictions]  # one batch

    def infer(images: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        return [detection for detection, _ in predictions]

    matched = run_validation(infer, tiny_split, batches, progress=False, scoring=Scoring(precision_recall=True))
    plain = run_validation(infer, tiny_split, batches, progress=False)
    table = validation_stats(predictions, tiny_split, 2)
    assert (matched.result.mean_precision, matched.result.mean_recall) == (table.mean_precision, table.mean_recall)
    assert 0 < table.mean_precision < 1 and matched.predictions is None
    assert plain.result.mean_precision is None and plain.result.mean_recall is None
    assert matched.result.metrics == plain.metrics  # the COCO metrics alike; the pass's metrics add P and R:
    assert matched.metrics == {**plain.metrics, "P": table.mean_precision, "R": table.mean_recall}


def test_a_batchs_coco_rows_are_the_same_from_its_host_copy(split: SplitData):
    """run_validation brings each batch's detections to the host in one copy and makes the COCO rows from that copy:
    FP16 boxes and scores (``--half``) and int64 labels, packed in FP32 and back, give the rows the detections gave."""
    from detector.metrics.coco import to_coco_detections
    from detector.postprocess import detections_to_host

    generator = torch.Generator().manual_seed(0)
    metas = [meta for _, _, batch_metas in make_val_loader(split, batch_size=8, workers=0) for meta in batch_metas]
    detections = []
    for count in (7, 0, 300, 1, 12):
        corners = torch.rand(count, 2, 2, generator=generator) * SIZE
        detections.append({"boxes": torch.cat([corners.amin(1), corners.amax(1)], 1).half(),
                           "scores": torch.rand(count, generator=generator).half(),
                           "labels": torch.randint(0, 2, (count,), generator=generator)})
    expected = to_coco_detections(detections, metas, split.category_ids)
    assert len(expected) == 320
    assert np.array_equal(to_coco_detections(detections_to_host(detections), metas, split.category_ids), expected)
