"""A dataset with every kind of bad input loads with one warning per problem and trains one epoch."""

import warnings
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

from detector.config import TrainConfig
from detector.data.build import load_records
from detector.data.dataset import read_image_rgb
from detector.data.spec import load_dataset_spec
from detector.trainer import train
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
    (labels / "rgba.txt").write_text("1 0.5 0.5 0.5 0.5\n0 0.5 0.5\n2 0.5 0.5 0.2 0.2 9\n")  # one good, two malformed
    cv2.imwrite(str(images / "deep.png"), (np.arange(64 * 64, dtype=np.uint16).reshape(64, 64) * 16))
    (labels / "deep.txt").write_text("5 0.5 0.5 0.2 0.2\n0 0.5 0.5 0 0.2\n1 0.3 0.3 0.2 0.2\n1 0.3 0.3 0.2 0.2\n")
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees on display
    Image.fromarray(np.zeros((40, 64, 3), np.uint8)).save(images / "rotated.jpg", exif=exif)
    (labels / "rotated.txt").write_text("0 0.5 0.5 0.3 0.3\n0 0.99 0.5 0.04 0.2\n0 7 7 0.1 0.1\n")
    cv2.imwrite(str(images / "background.png"), np.full((64, 64, 3), 30, np.uint8))  # no label file


def test_bad_data_is_fixed_or_skipped_with_warnings_and_trains(tmp_path: Path):
    yaml = write_yolo_dataset(tmp_path / "bad", train=6, val=3)
    _add_bad_files(tmp_path / "bad")
    spec = load_dataset_spec(yaml)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records, _, image_hw, _ = load_records(spec, "train")
    messages = [str(w.message) for w in caught]
    kept = {r.path.name for r in records}
    assert not {"garbage.jpg", "empty.jpg", "truncated.jpg"} & kept
    assert {"gray.png", "rgba.png", "deep.png", "rotated.jpg", "background.png"} <= kept
    for name in ("garbage.jpg", "empty.jpg", "truncated.jpg"):
        assert any(name in m and "skipped" in m for m in messages), name
    for fragment in ("rgba.txt:2: expected 5 columns", "rgba.txt:3: expected 5 columns", "deep.txt:1: class 5 outside",
                     "deep.txt: 1 zero-area", "deep.txt: 1 duplicate", "rotated.txt: 1 box(es) far outside", "rotated.txt: box coordinates slightly outside"):
        assert any(fragment in m for m in messages), fragment
    assert all("\n" not in m for m in messages)
    by_name = dict(zip((r.path.name for r in records), image_hw))
    assert by_name["rotated.jpg"] == (64, 40)  # EXIF orientation applied to the size
    assert read_image_rgb(records[0].path.parent / "rotated.jpg").shape == (64, 40, 3)
    assert read_image_rgb(records[0].path.parent / "deep.png").dtype == np.uint8
    assert read_image_rgb(records[0].path.parent / "gray.png").shape == (64, 48, 3)
    cache = (tmp_path / "bad" / "images" / "train").with_suffix(".verified.json")
    assert cache.is_file()

    summary = train(TrainConfig(data=str(yaml), device="cpu", imgsz=64, epochs=1, batch=4, workers=0, cache="none",
                                project=str(tmp_path / "runs"), plots=False, amp_check=False), progress=False)
    assert summary["epochs_done"] == 1


def test_verification_cache_is_reused_and_invalidated(tmp_path: Path, monkeypatch):
    yaml = write_yolo_dataset(tmp_path / "d", train=3, val=1)
    spec = load_dataset_spec(yaml)
    load_records(spec, "train")
    calls = []
    import detector.data.verify_cache as verify_cache

    original = verify_cache.verify_images
    monkeypatch.setattr(verify_cache, "verify_images", lambda records: calls.append(len(records)) or original(records))
    load_records(spec, "train")
    (tmp_path / "d" / "images" / "train" / "train_00000.png").write_bytes(b"broken now")
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        records, *_ = load_records(spec, "train")
    assert calls == [0, 1]  # nothing re-decoded the second time; only the changed file the third
    assert "train_00000.png" not in {r.path.name for r in records}
