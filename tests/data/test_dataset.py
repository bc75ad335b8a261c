"""The dataset's items (detector/data/dataset.py): evaluation items against predict's pre-processing (the same
pixels), a padded batch's repeat, and the channel swap (--bgr) on each augmentation path."""

from __future__ import annotations

import dataclasses
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


def _paths_with_and_without_the_swap(tmp_path: Path) -> dict[str, tuple[DetectionDataset, ...]]:
    """Per path (workers, pixels, device): the same training items at --bgr 0, 1 and 1e-9, with MixUp and
    albumentations drawn too (their draws come before the swap's)."""
    from detector.data.augment import AugmentConfig
    from tests.conftest import write_records

    records = write_records(tmp_path, 4, seed=4)
    places = {"workers": {}, "pixels": {"pixel_ops_on_device": True}, "device": {"geometry_on_device": True}}
    return {path: tuple(DetectionDataset(records, image_size=64, seed=2, **where, augment=AugmentConfig(
        flipud=0.5, mixup=0.5, albumentations=0.5, bgr=bgr)) for bgr in (0.0, 1.0, 1e-9))
        for path, where in places.items()}


SWAP_KEYS = [(index, epoch, use_mosaic) for index in range(4) for epoch in range(2) for use_mosaic in (True, False)]


def test_bgr_1_reverses_every_training_items_channels_and_changes_nothing_else_on_each_path(tmp_path: Path) -> None:
    """--bgr 1: every item's pixels are the --bgr 0 item's with the channel order reversed, as the last operation
    (after HSV and the flips), its boxes and every other draw the same; the swap's draw is the item's last, so a
    --bgr that draws it but never swaps (1e-9) gives the --bgr 0 items bit for bit."""
    from detector.data.batch_augment import apply_pixel_ops
    from detector.data.dataset import collate
    from detector.training.step_input import step_input

    for path, (plain, swapped, drawn) in _paths_with_and_without_the_swap(tmp_path).items():
        made = {}
        for name, dataset in (("plain", plain), ("swapped", swapped), ("drawn", drawn)):
            made[name] = collate([dataset[key] for key in SWAP_KEYS])
        (images, targets, metas), (swapped_images, swapped_targets, swapped_metas) = made["plain"], made["swapped"]
        assert torch.equal(swapped_targets, targets), path
        if path == "workers":  # swapped in the loader: the uint8 pixels themselves
            assert all(meta.pixel_ops is None for meta in swapped_metas)
            assert torch.equal(swapped_images, images.flip(1)) and not torch.equal(swapped_images, images)
            assert torch.equal(made["drawn"][0], images), path
            continue
        # Left to the step: the same pixels (or warp sources) sent, the swap carried as a flag beside HSV and flips.
        assert [meta.pixel_ops for meta in swapped_metas] == [
            dataclasses.replace(meta.pixel_ops, swap_channels=True) for meta in metas], path
        assert [meta.pixel_ops for meta in made["drawn"][2]] == [meta.pixel_ops for meta in metas], path
        ops, swapped_ops = ([meta.pixel_ops for meta in batch] for batch in (metas, swapped_metas))
        stepped, stepped_swapped, stepped_drawn = (
            step_input(batch[0], 64, torch.device("cpu"), channels_last=True, pixel_ops=pixel_ops)
            for batch, pixel_ops in ((made["plain"], ops), (made["swapped"], swapped_ops), (made["drawn"], ops)))
        assert torch.equal(stepped_swapped, stepped.flip(1)), path  # a permutation: exact
        assert torch.equal(stepped_drawn, stepped), path
        if path == "pixels":  # the loader's pixels themselves are the same (on device, its atlas has unwritten gaps)
            assert torch.equal(swapped_images, images) and torch.equal(made["drawn"][0], images)
            assert torch.equal(stepped, apply_pixel_ops(images.float() / 255, ops))
