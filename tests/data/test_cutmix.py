"""CutMix (Ultralytics 8.4's cutmix): the rectangle draws, which rectangle and which partner boxes, and the items."""

import dataclasses

import cv2
import numpy as np
import pytest
import torch

from detector.data.augment import AugmentConfig
from detector.data.cutmix import boxes_inside, choose_rectangle, draw_rectangles
from detector.data.dataset import DetectionDataset
from detector.data.records import Records
from tests.conftest import write_records


def test_rectangles_are_ultralytics_cuts_clipped_to_the_image():
    """Each rectangle: ``lam ~ Beta(1, 1)``, a side ``int(side * sqrt(1 - lam))``, half of it (rounded down) each way
    of a centre drawn among the pixels, clipped; three draws a rectangle in that order. An image wider than tall
    catches swapped axes."""
    rng, twin = np.random.default_rng(0), np.random.default_rng(0)
    height, width = 48, 80
    for _ in range(100):
        for x1, y1, x2, y2 in draw_rectangles(rng, height, width).tolist():
            cut = np.sqrt(1.0 - twin.beta(1.0, 1.0))
            half_w, half_h = int(width * cut) // 2, int(height * cut) // 2
            centre_x, centre_y = twin.integers(width), twin.integers(height)
            assert (x1, x2) == (max(centre_x - half_w, 0), min(centre_x + half_w, width))
            assert (y1, y2) == (max(centre_y - half_h, 0), min(centre_y + half_h, height))


def test_the_chosen_rectangle_overlaps_no_box():
    """A rectangle sharing only an edge with a box is free (no area in common); one is drawn uniformly among the
    free ones; None when every one covers a box."""
    rectangles = np.array([[0, 0, 10, 10], [10, 0, 20, 10], [30, 30, 40, 40]])
    boxes = np.array([[5, 5, 10, 10]], np.float32)
    rng = np.random.default_rng(1)
    chosen = [tuple(choose_rectangle(rng, rectangles, boxes)) for _ in range(200)]
    assert set(chosen) == {(10, 0, 20, 10), (30, 30, 40, 40)}
    assert choose_rectangle(rng, rectangles[:1], boxes) is None
    assert choose_rectangle(rng, rectangles[:1], np.zeros((0, 4), np.float32)) is not None  # no boxes: all free


def test_partner_boxes_come_along_with_a_tenth_of_their_area_inside_clipped():
    rectangle = np.array([10, 10, 30, 30])
    boxes = np.array([
        [12, 12, 20, 20],  # inside: kept as it is
        [20, 20, 40, 40],  # a quarter inside: kept, clipped
        [0, 10, 200, 20],  # exactly a tenth inside (200 of 2000 px): kept, clipped
        [25, 0, 45, 12],  # 10 of 240 px inside: dropped
        [30, 10, 40, 20],  # an edge in common only: dropped
        [40, 40, 50, 50],  # outside: dropped
    ], np.float32)
    kept, classes = boxes_inside(rectangle, boxes, np.arange(6, dtype=np.float32))
    np.testing.assert_array_equal(kept, [[12, 12, 20, 20], [20, 20, 30, 30], [10, 10, 30, 20]])
    assert classes.tolist() == [0, 1, 2]


LEVELS = [30, 60, 90, 150, 180, 210]  # a flat grey per image; not 114, the fill


def _flat_records(folder) -> Records:
    """Flat grey 64 px images, three 8 px boxes each at multiples of 4 px (exact in float32 through the labels)."""
    rng = np.random.default_rng(0)
    paths, labels = [], []
    for index, level in enumerate(LEVELS):
        paths.append(folder / f"{index}.png")
        cv2.imwrite(str(paths[-1]), np.full((64, 64, 3), level, np.uint8))
        corners = rng.integers(0, 15, (3, 2)) * 4
        labels.append(np.array([[k, (x + 4) / 64, (y + 4) / 64, 8 / 64, 8 / 64] for k, (x, y) in enumerate(corners)],
                               np.float32))
    return Records.from_lists(paths, labels, range(len(LEVELS)), [(64, 64)] * len(LEVELS))


def _xyxy(labels: torch.Tensor) -> np.ndarray:
    centres, sides = labels[:, 1:3].numpy() * 64, labels[:, 3:5].numpy() * 64
    return np.concatenate((centres - sides / 2, centres + sides / 2), 1)


def _shared(boxes: np.ndarray, rectangle: tuple) -> np.ndarray:
    """Each box's area inside the rectangle."""
    low, high = np.maximum(boxes[:, :2], rectangle[:2]), np.minimum(boxes[:, 2:], rectangle[2:])
    return (high - low).clip(0).prod(1)


def test_an_item_gets_a_rectangle_of_a_partner_and_the_boxes_it_holds(tmp_path):
    """No geometry, HSV or flip drawn: each item is its own flat grey, or that with one rectangle of a partner's
    grey that overlaps none of its boxes, and the partner's boxes the rectangle holds a tenth of, clipped to it.
    Off in close-mosaic epochs."""
    records = _flat_records(tmp_path)
    still = dict(mosaic=0.0, translate=0.0, scale=0.0, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0, fliplr=0.0, albumentations=0.0)
    cut = DetectionDataset(records, image_size=64, augment=AugmentConfig(cutmix=1.0, **still), seed=3)
    plain = DetectionDataset(records, image_size=64, augment=AugmentConfig(**still), seed=3)
    pasted = clipped = 0
    for index in range(len(LEVELS)):
        own = _xyxy(torch.from_numpy(records.labels_of(index)))
        for epoch in range(12):
            image, labels, _ = cut[(index, epoch, True)]
            boxes = _xyxy(labels)
            np.testing.assert_array_equal(boxes[:3], own)  # the item's own boxes first, unchanged
            changed = (image != LEVELS[index]).any(0).numpy()
            if not changed.any():  # none pasted, or its own pixels (its own boxes, clipped, come along then)
                assert all(((own[:, :2] <= box[:2]) & (box[2:] <= own[:, 2:])).all(1).any() for box in boxes[3:])
                continue
            ys, xs = np.nonzero(changed)
            x1, y1, x2, y2 = xs.min(), ys.min(), xs.max() + 1, ys.max() + 1
            assert changed.sum() == (x2 - x1) * (y2 - y1)  # one rectangle
            (level,) = torch.unique(image[:, y1:y2, x1:x2]).tolist()
            partner = _xyxy(torch.from_numpy(records.labels_of(LEVELS.index(level))))
            assert (_shared(own, (x1, y1, x2, y2)) == 0).all()  # the rectangle covers none of the item's boxes
            inside = _shared(partner, (x1, y1, x2, y2)) >= 0.1 * 64  # a tenth of an 8 px box's 64 px
            expected = partner[inside].copy()
            expected[:, 0::2], expected[:, 1::2] = expected[:, 0::2].clip(x1, x2), expected[:, 1::2].clip(y1, y2)
            np.testing.assert_array_equal(boxes[3:], expected)
            assert len(expected) > 0  # a rectangle bringing no box is not pasted
            pasted, clipped = pasted + 1, clipped + int((expected != partner[inside]).any())
        closing = (index, 0, False)  # a close-mosaic epoch: no CutMix
        assert torch.equal(cut[closing][0], plain[closing][0]) and torch.equal(cut[closing][1], plain[closing][1])
    assert pasted >= 5 and clipped >= 1, (pasted, clipped)  # the checks above saw both kinds


# Draws of the pixels path's items before --cutmix existed (commit 52549e4): box count, HSV (drawn after the
# geometry and MixUp, so any draw added before it moves them) and flips, for (index, epoch) in 4 x 3, mosaic on.
BEFORE_CUTMIX = [
    (11, -0.00322786, 0.990232226, 1.141351481, False, False), (7, -0.002050749, 0.382749685, 0.941850652, False, True),
    (12, -0.011514989, 1.608492874, 1.3253588, False, True), (4, -0.002990101, 0.604863703, 0.701825766, False, False),
    (7, 0.002333257, 0.729549292, 0.656263481, True, False), (18, -0.004128561, 0.939368312, 1.153109098, False, True),
    (3, 0.004682695, 0.371070849, 1.074470926, True, True), (9, 0.010126683, 0.398104212, 1.305232279, False, False),
    (5, 0.003083826, 0.784832556, 0.924371771, True, True), (5, -0.006112281, 0.733793637, 1.348882864, False, True),
    (9, 0.010142626, 1.081589327, 0.751417279, False, True), (2, 0.008744449, 0.346704104, 1.164680306, False, True),
]


def test_cutmix_0_draws_nothing(tmp_path):
    """At 0 nothing is drawn for CutMix: every item is drawn as before the option existed (MixUp and
    albumentations on, so their draws are checked too). The draws are PCG64's doubles, the same on every machine;
    9 decimals tell any shifted draw apart."""
    config = AugmentConfig(cutmix=0.0, mixup=0.5, flipud=0.5, degrees=10.0, shear=3.0, albumentations=0.5)
    pixels = DetectionDataset(write_records(tmp_path, 4, seed=1), image_size=64, augment=config, seed=5,
                              pixel_ops_on_device=True)
    drawn = []
    for index in range(4):
        for epoch in range(3):
            _, labels, meta = pixels[(index, epoch, True)]
            ops = meta.pixel_ops
            drawn.append((len(labels), *(round(v, 9) for v in ops.hsv), ops.flip_lr, ops.flip_ud))
    assert drawn == BEFORE_CUTMIX
    with pytest.raises(AssertionError):  # the check can fail: at 1 the draws after CutMix's move
        cut = DetectionDataset(pixels.records, image_size=64, augment=dataclasses.replace(config, cutmix=1.0), seed=5,
                               pixel_ops_on_device=True)
        assert [round(cut[(i, e, True)][2].pixel_ops.hsv[0], 9) for i in range(4) for e in range(3)] == [
            row[1] for row in BEFORE_CUTMIX]
