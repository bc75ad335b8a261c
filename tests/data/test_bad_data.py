"""A dataset with every kind of bad input loads with one warning per problem and trains one epoch."""

import warnings
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from detector.training.config import TrainConfig
from detector.data import problems
from detector.data.build import load_records
from detector.data.images import read_image_rgb
from detector.data.spec import DatasetError, load_dataset_spec
from detector.training.trainer import train
from tests.conftest import write_yolo_dataset


def _add_bad_files(root: Path) -> None:
    images, labels = root / "images" / "train", root / "labels" / "train"
    (images / "garbage.jpg").write_bytes(b"not an image at all")
    (images / "empty.jpg").write_bytes(b"")
    good = cv2.imencode(".jpg", np.full((64, 64, 3), 90, np.uint8))[1].tobytes()
    (images / "truncated.jpg").write_bytes(good[: len(good) // 2])
    gray = np.zeros((64, 48), np.uint8)
    gray[10:40, 10:30] = 255
    cv2.imwrite(str(images / "gray.png"), gray)
    (labels / "gray.txt").write_text("0 0.4166 0.3906 0.4166 0.4687\n")
    cv2.imwrite(str(images / "rgba.png"), np.dstack([np.full((64, 64, 3), 200, np.uint8), np.full((64, 64), 255, np.uint8)]))
    (labels / "rgba.txt").write_text("1 0.5 0.5 0.5 0.5\n")
    cv2.imwrite(str(images / "deep.png"), (np.arange(64 * 64, dtype=np.uint16).reshape(64, 64) * 16))
    (labels / "deep.txt").write_text("0 0.5 0.5 0 0.2\n1 0.3 0.3 0.2 0.2\n1 0.3 0.3 0.2 0.2\n")  # dropped, removed
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees on display
    Image.fromarray(np.zeros((40, 64, 3), np.uint8)).save(images / "rotated.jpg", exif=exif)
    # One box slightly past the edge (rounding), one centred inside and reaching 3% past it: both clipped.
    (labels / "rotated.txt").write_text("0 0.5 0.5 0.3 0.3\n0 0.99 0.5 0.04 0.2\n0 0.02 0.5 0.1 0.2\n")
    # A line that cannot be read leaves the image's boxes unknown: each of these images is skipped.
    for name, text in (("columns", "1 0.5 0.5 0.5 0.5\n0 0.5 0.5\n2 0.5 0.5 0.2 0.2 0.9\n"),
                       ("classes", "5 0.5 0.5 0.2 0.2\n1 0.3 0.3 0.2 0.2\n"), ("far", "0 7 7 0.1 0.1\n")):
        cv2.imwrite(str(images / f"{name}.png"), np.full((64, 64, 3), 120, np.uint8))
        (labels / f"{name}.txt").write_text(text)
    cv2.imwrite(str(images / "background.png"), np.full((64, 64, 3), 30, np.uint8))  # no label file


def test_bad_data_is_fixed_or_skipped_with_one_line_per_kind_and_trains(tmp_path: Path):
    yaml = write_yolo_dataset(tmp_path / "bad", train=6, val=3)
    _add_bad_files(tmp_path / "bad")
    spec = load_dataset_spec(yaml)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records, _, _ = load_records(spec, "train")
    messages = [str(w.message) for w in caught]
    kept = {r.path.name for r in records}
    assert not {"garbage.jpg", "empty.jpg", "truncated.jpg", "columns.png", "classes.png", "far.png"} & kept
    assert {"gray.png", "rgba.png", "deep.png", "rotated.jpg", "background.png"} <= kept
    unreadable = [m for m in messages if problems.UNREADABLE_IMAGE in m]
    assert len(unreadable) == 1 and unreadable[0].startswith("data.yaml 'train': 3 unreadable")
    assert all(name in unreadable[0] for name in ("garbage.jpg", "empty.jpg (zero-byte file)", "truncated.jpg"))
    expected = {  # kind -> (count, a place it names)
        problems.WRONG_COLUMNS: (1, "columns.txt:2"),
        problems.SCORE_COLUMN: (1, "columns.txt:3"),
        problems.CLASS_OUT_OF_RANGE: (1, "classes.txt:1"),
        problems.ZERO_AREA: (1, "deep.txt"),
        problems.DUPLICATE: (1, "deep.txt"),
        problems.FAR_OUTSIDE: (1, "far.txt"),
        problems.CLIPPED: (1, "rotated.txt"),
        problems.CLIPPED_FAR: (1, "rotated.txt"),
    }
    for kind, (count, place) in expected.items():
        lines = [m for m in messages if kind in m]
        assert len(lines) == 1 and f" {count} {kind}" in lines[0] and place in lines[0], (kind, lines)
    assert len(messages) == len(expected) + 1 and all("\n" not in m for m in messages)
    by_name = dict(zip((r.path.name for r in records), records.hw_list()))
    assert by_name["rotated.jpg"] == (64, 40)  # EXIF orientation applied to the size
    assert read_image_rgb(records[0].path.parent / "rotated.jpg").shape == (64, 40, 3)
    assert read_image_rgb(records[0].path.parent / "deep.png").dtype == np.uint8
    assert read_image_rgb(records[0].path.parent / "gray.png").shape == (64, 48, 3)
    assert (tmp_path / "bad" / "images" / "train.records.npz").is_file()

    summary = train(TrainConfig(data=str(yaml), device="cpu", imgsz=64, epochs=1, batch=4, workers=0, cache="none",
                                project=str(tmp_path / "runs"), plots=False, amp_check=False), progress=False)
    assert summary["epochs_done"] == 1


def test_image_that_fails_to_decode_later_is_replaced_in_training_and_blank_in_evaluation(tmp_path: Path):
    from detector.data.augment import AugmentConfig
    from detector.data.dataset import DetectionDataset
    from tests.conftest import write_records

    records = write_records(tmp_path, 3, seed=4)
    records.path(1).write_bytes(b"corrupted after the start-up check")
    train_set = DetectionDataset(records, image_size=64, augment=AugmentConfig(mosaic=0.0), seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        image, labels, meta = train_set[(1, 0, False)]
    assert image.shape == (3, 64, 64) and meta.unreadable == str(records.path(1))
    assert meta.image_id == 2  # drawn again from the next index
    assert len(caught) == 1 and "1.png: failed to decode" in str(caught[0].message)

    eval_set = DetectionDataset(records, image_size=64)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        image, labels, meta = eval_set[1]
    assert meta.image_id == 1 and meta.unreadable == str(records.path(1)) and len(labels) == 0
    assert int(image.float().std()) == 0  # blank: scored as an image with nothing found
    assert eval_set[0][2].unreadable == ""


def test_a_split_without_boxes_stops_training_and_warns_evaluation(tmp_path: Path, capsys):
    """A misnamed labels folder leaves every image a background image: training would learn that nothing is ever
    there, so it stops in one line naming where labels were looked for; evaluating such a split only warns (its mAP is
    undefined), as Ultralytics stops or warns with "No labels found"."""
    yaml_path = write_yolo_dataset(tmp_path / "d")
    (tmp_path / "d" / "labels").rename(tmp_path / "d" / "label")
    spec = load_dataset_spec(yaml_path)
    with pytest.raises(DatasetError) as raised:
        load_records(spec, "train", training=True)
    message = str(raised.value)
    assert "'train' split has no boxes" in message and "8 images' label files" in message
    assert str(tmp_path / "d" / "labels" / "train") in message and "\n" not in message
    records, _, _ = load_records(spec, "val")
    assert len(records) == 4
    warning = capsys.readouterr().err.strip()
    assert warning.startswith("warning: ") and "'val' split has no boxes" in warning and "\n" not in warning


def test_a_summary_naming_a_few_places_says_where_every_one_is_listed(tmp_path: Path):
    yaml = write_yolo_dataset(tmp_path / "d", train=6, val=3)
    label_files = sorted((tmp_path / "d" / "labels" / "train").glob("*.txt"))
    for label_file in label_files[:5]:
        label_file.write_text(label_file.read_text() + "0 0.5 0.5 0.3\n")
    spec = load_dataset_spec(yaml)
    for _ in range(2):  # scanned, then from the cache
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            load_records(spec, "train")
        listing = tmp_path / "d" / "images" / "train.problems.txt"
        (line,) = [str(w.message) for w in caught if problems.WRONG_COLUMNS in str(w.message)]
        assert line.endswith(f", ... (2 more; every one in {listing})")
        listed = listing.read_text().splitlines()
        assert listed == [f"{problems.WRONG_COLUMNS}: {f}:{len(f.read_text().splitlines())}" for f in label_files[:5]]
