"""The dataset's items (detector/data/dataset.py): evaluation items against predict's pre-processing (the same
pixels), a padded batch's repeat, the channel swap (--bgr) on each augmentation path, and --rect's training items
(warped into their batch's canvas) against the evaluation items of the same canvas."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from detector.data.augment import PAD_VALUE
from detector.data.dataset import DetectionDataset, collate
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


# Augmentation that changes nothing: no zoom (scale 0 draws 1), no shift (translate 0 draws the centre), no rotation,
# shear or tilt, HSV gains of 1, no flips, no albumentations, no mixing.
STILL = dict(mosaic=0.0, degrees=0.0, translate=0.0, scale=0.0, shear=0.0, perspective=0.0, hsv_h=0.0, hsv_s=0.0,
             hsv_v=0.0, fliplr=0.0, flipud=0.0, albumentations=0.0)


def _noise_records(tmp_path: Path, shapes: list[tuple[int, int]]) -> Records:
    """Noise images of ``shapes`` (height, width), two boxes each (normalised labels)."""
    rng = np.random.default_rng(7)
    paths = []
    for index, (height, width) in enumerate(shapes):
        paths.append(tmp_path / f"{index}.png")
        cv2.imwrite(str(paths[-1]), rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
    labels = [np.array([[0, 0.3, 0.4, 0.2, 0.3], [1, 0.7, 0.6, 0.3, 0.2]], np.float32)] * len(shapes)
    return Records.from_lists(paths, labels, range(len(shapes)), shapes)


@pytest.mark.parametrize("shape", [(96, 128), (90, 128), (200, 150), (91, 128), (128, 75), (300, 250)])
def test_a_still_rect_training_item_is_the_letterboxed_evaluation_item_of_its_canvas(tmp_path: Path,
                                                                                       shape: tuple[int, int]) -> None:
    """--rect with every augmentation at 0: the training item is the image (long side 128) warped into its canvas
    by a pure translation, ``(canvas - side) / 2`` on each axis, which is the letterbox's padding where that is a
    whole number (96x128: none; 90x128: 3 rows above; the 200x150 file, resized to 128x96 by both, fills its
    canvas), so the pixels and boxes are the evaluation item's, exactly. Where it is a half (91x128 in a 96-row
    canvas: 2.5 rows; 75 wide in 96: 10.5 columns; 300x250 resized to 128x107 in the square: 10.5), the letterbox
    pads the whole number below it, and the warp's every sample falls half way between two of those pixels:
    bilinear takes their mean, which OpenCV's fixed-point arithmetic rounds to a grey level (at most half a level
    off), and the boxes sit half a pixel further."""
    from detector.data.augment import AugmentConfig

    records = _noise_records(tmp_path, [shape])
    canvases = rect_batches(records.image_hw, 128, 1, 32)[1]
    train = DetectionDataset(records, image_size=128, augment=AugmentConfig(**STILL)).with_canvases(canvases)
    evaluation = DetectionDataset(records, image_size=128).with_canvases(canvases)
    image, labels, meta = train[(0, 0, False)]
    expected, expected_labels, expected_meta = evaluation[0]
    height, width = (int(side) for side in canvases[0])
    assert tuple(image.shape) == tuple(expected.shape) == (3, height, width) and meta.original_hw == (height, width)
    resized = expected_meta.resized_hw
    pad_x, pad_y = expected_meta.pad
    shift = np.array([(width - resized[1]) / 2 - pad_x, (height - resized[0]) / 2 - pad_y])
    assert set(shift) <= {0.0, 0.5}
    # Labels: normalised by the canvas, the centres half a pixel on where the warp is, sizes the same.
    assert torch.equal(labels[:, 0], expected_labels[:, 0])
    torch.testing.assert_close(labels[:, 1:3], expected_labels[:, 1:3] + torch.tensor(shift / [width, height],
                                                                                        dtype=torch.float32))
    torch.testing.assert_close(labels[:, 3:], expected_labels[:, 3:])
    corners = torch.cat((labels[:, 1:3] - labels[:, 3:] / 2, labels[:, 1:3] + labels[:, 3:] / 2), 1)
    assert bool(((corners >= 0) & (corners <= 1)).all())  # inside the canvas
    # Pixels: the letterbox's, or on a half-pixel axis the mean of each and its neighbour before it (fill before the
    # first), exact in float, against OpenCV's rounding of it.
    if not shift.any():
        assert torch.equal(image, expected)
        return
    mean = expected.float()
    for dim, half in ((2, shift[0]), (1, shift[1])):  # x is the tensor's dim 2, y its dim 1
        if half:
            mean = (mean + F.pad(mean, (1, 0, 0, 0) if dim == 2 else (0, 0, 1, 0), value=PAD_VALUE).narrow(
                dim, 0, mean.shape[dim])) / 2
    assert float((image.float() - mean).abs().max()) <= 0.5


def test_a_rect_training_item_is_warped_into_its_canvas_and_its_boxes_clipped_to_it(tmp_path: Path) -> None:
    """With the default augmentation (zoom, shift, flips, HSV) every item fills its own batch's canvas, its boxes
    inside it and normalised by it; a repeat key (index + size) reads the same image onto the same canvas."""
    from detector.data.augment import AugmentConfig

    records = _noise_records(tmp_path, [(96, 128), (128, 64), (128, 128), (64, 128)])
    canvases = rect_batches(records.image_hw, 128, 2, 32)[1]
    dataset = DetectionDataset(records, image_size=128, augment=AugmentConfig(mosaic=0.0)).with_canvases(canvases)
    for index in range(4):
        for key in ((index, 1, True), (index + 4, 1, True)):
            image, labels, meta = dataset[key]
            assert tuple(image.shape[1:]) == tuple(canvases[index]) == meta.original_hw
            corners = torch.cat((labels[:, 1:3] - labels[:, 3:] / 2, labels[:, 1:3] + labels[:, 3:] / 2), 1)
            assert bool(((corners >= -1e-6) & (corners <= 1 + 1e-6)).all())
    batch = collate([dataset[(index, 0, False)] for index in (0, 3)])  # one canvas: 96x128 (landscape pair)
    assert tuple(batch[0].shape) == (2, 3, 96, 128)


def test_rect_training_refuses_mixing_and_the_device_warp(tmp_path: Path) -> None:
    from detector.data.augment import AugmentConfig

    records = _noise_records(tmp_path, [(96, 128)])
    canvases = rect_batches(records.image_hw, 128, 1, 32)[1]
    for augment, where in ((AugmentConfig(), {}), (AugmentConfig(mosaic=0.0, mixup=0.1), {}),
                           (AugmentConfig(mosaic=0.0), {"geometry_on_device": True})):
        with pytest.raises(ValueError, match="rectangular training batches take no mosaic, MixUp or CutMix"):
            DetectionDataset(records, image_size=128, augment=augment, **where).with_canvases(canvases)


@pytest.mark.parametrize("where", [{}, {"pixel_ops_on_device": True}])
def test_square_canvases_give_the_square_items_bit_for_bit(tmp_path: Path, where: dict) -> None:
    """The canvas path with every canvas the --imgsz square is the square path: the same draws, pixels and labels
    (the warp's generalisation to (height, width) changed nothing for a square)."""
    from detector.data.augment import AugmentConfig

    records = _noise_records(tmp_path, [(96, 128), (128, 64), (50, 128)])
    config = AugmentConfig(mosaic=0.0, degrees=10, shear=3, perspective=0.0005, flipud=0.5, albumentations=0.5)
    square = DetectionDataset(records, image_size=128, augment=config, seed=5, **where)
    canvas = square.with_canvases(np.full((3, 2), 128))
    for key in ((0, 0, True), (1, 2, True), (2, 1, False), (5, 1, True)):
        for ours, theirs in zip(canvas[key], square[key]):
            assert torch.equal(ours, theirs) if isinstance(ours, torch.Tensor) else ours == theirs
