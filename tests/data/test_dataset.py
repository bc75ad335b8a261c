"""The dataset's evaluation items (detector/data/dataset.py) against predict's pre-processing: the same pixels."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from detector.data.dataset import DetectionDataset
from detector.data.images import read_image_rgb
from detector.data.letterbox import rect_batches
from detector.data.records import Records
from detector.inference.preprocess import prepare_batch


@pytest.mark.parametrize("rectangular", [False, True])
def test_a_shrunk_image_is_validated_on_the_pixels_predict_makes_of_it(tmp_path: Path, rectangular: bool) -> None:
    """A 100x200 image at 64 px (ratio 0.32, where INTER_AREA and bilinear differ by grey levels on noise): the
    validation item, read through load_resized then letterboxed, equals predict's one letterbox of the file on the
    CPU, to the pixel, in the square and in a rectangular batch (predict's ``tight`` canvas)."""
    noise = np.random.default_rng(0).integers(0, 256, (100, 200, 3), dtype=np.uint8)
    path = tmp_path / "noise.png"
    cv2.imwrite(str(path), noise)
    records = Records.from_lists([path], [np.array([[0, 0.5, 0.5, 0.2, 0.2]])], [0], [(100, 200)])
    dataset = DetectionDataset(records, image_size=64)
    if rectangular:
        dataset = dataset.with_canvases(rect_batches(records.image_hw, 64, 1, 32)[1])
    image, _, meta = dataset[0]
    batch, transforms = prepare_batch([read_image_rgb(path)], 64, tight=32 if rectangular else None)
    assert tuple(image.shape) == tuple(batch[0].shape) == ((3, 32, 64) if rectangular else (3, 64, 64))
    assert torch.equal(image, batch[0])
    assert (meta.ratio, meta.pad, meta.resized_hw) == (transforms[0].ratio, transforms[0].pad, transforms[0].resized_hw)


def test_a_padded_batch_s_repeat_reads_the_same_image_with_draws_of_its_own(tmp_path: Path) -> None:
    """The sampler fills a last batch by wrapping round its order; the repeat's key was the image's own, so the epoch
    held the very same augmented item twice. Its key is now the index past the dataset's size: the same image (its
    id), other draws; the item of the image's own key is as it was (the draws' stream of its index)."""
    from detector.data.augment import AugmentConfig
    from detector.data.build import build_split
    from detector.data.sampler import EpochSampler
    from detector.data.spec import load_dataset_spec
    from tests.conftest import write_yolo_dataset

    spec = load_dataset_spec(write_yolo_dataset(tmp_path, train=5, val=1, size=64))
    dataset = build_split(spec, "train", image_size=64, augment=AugmentConfig(), cache="none").dataset
    keys = list(EpochSampler(5, seed=0, batch=4))  # 5 images in batches of 4: 3 repeats
    repeat = next(key for key in keys if key[0] >= 5)
    first = next(key for key in keys if key[0] == repeat[0] - 5)
    image, _, meta = dataset[first]
    again, _, meta_again = dataset[repeat]
    assert meta_again.image_id == meta.image_id  # the same image ...
    assert not torch.equal(again, image)  # ... drawn anew
    assert torch.equal(dataset[first][0], image)  # and each key's item is a pure function of it
