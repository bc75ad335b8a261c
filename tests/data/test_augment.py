import os
import subprocess
import sys
import textwrap

import cv2
import numpy as np
import pytest
import torch

from detector.data.augment import (
    HSV_UNCHANGED,
    AugmentConfig,
    PixelTransforms,
    augment_hsv,
    draw_hsv,
    mosaic,
    random_affine,
)
from detector.data.dataset import DetectionDataset, collate
from detector.data.letterbox import letterbox
from detector.data.synthetic import make_image
from tests.conftest import write_records


def test_letterbox_keeps_aspect_and_reports_padding():
    image = np.zeros((50, 100, 3), np.uint8)
    boxed, ratio, (left, top) = letterbox(image, 64)
    assert boxed.shape == (64, 64, 3) and ratio == pytest.approx(0.64) and left == 0 and top == 16


def test_mosaic_and_affine_keep_boxes_inside_the_image():
    rng = np.random.default_rng(0)
    config = AugmentConfig(degrees=20, shear=5, translate=0.2, scale=0.5)
    for _ in range(20):
        images, boxes, classes = [], [], []
        for _ in range(4):
            image, labels = make_image(rng, 64)
            cx, cy, w, h = (labels[:, i] * 64 for i in range(1, 5))
            images.append(image)
            boxes.append(np.stack((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2), 1).astype(np.float32))
            classes.append(labels[:, 0])
        canvas, out_boxes, out_classes = mosaic(images, boxes, classes, 64, rng)
        assert canvas.shape == (128, 128, 3)
        warped, final, final_classes = random_affine(canvas, out_boxes, out_classes, 64, config, rng)
        assert warped.shape == (64, 64, 3) and len(final) == len(final_classes)
        if len(final):
            assert final.min() >= 0 and final[:, [0, 2]].max() <= 64 and final[:, [1, 3]].max() <= 64
            assert ((final[:, 2:] - final[:, :2]) > 2).all()


def test_training_items_are_deterministic_per_epoch_and_boxes_normalised(tmp_path):
    records = write_records(tmp_path, 4, seed=1)
    dataset = DetectionDataset(records, image_size=64, augment=AugmentConfig(albumentations=0.5), seed=3)
    first, again, other_epoch = dataset[(0, 5, True)], dataset[(0, 5, True)], dataset[(0, 6, True)]
    assert first[0].shape == (3, 64, 64)
    assert np.array_equal(first[0].numpy(), again[0].numpy())
    assert not np.array_equal(first[0].numpy(), other_epoch[0].numpy())
    for key in range(4):
        _, labels, _ = dataset[(key, 0, True)]
        if len(labels):
            corners = np.concatenate((labels[:, 1:3] - labels[:, 3:5] / 2, labels[:, 1:3] + labels[:, 3:5] / 2), 1)
            assert corners.min() >= -1e-6 and corners.max() <= 1 + 1e-6


def test_collated_batch_is_channels_last_with_the_items_pixels(tmp_path):
    records = write_records(tmp_path, 3, seed=2)
    dataset = DetectionDataset(records, image_size=64, augment=AugmentConfig(), seed=0)
    items = [dataset[(i, 0, True)] for i in range(3)] + [DetectionDataset(records, image_size=64)[0]]
    images, targets, _ = collate(items)
    assert images.shape == (4, 3, 64, 64) and images.dtype == torch.uint8
    assert images.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(images, torch.stack([item[0].contiguous() for item in items]))
    assert targets[:, 0].tolist() == [i for i, item in enumerate(items) for _ in range(len(item[1]))]


def test_each_pixel_transform_fires_with_its_probability_independently_and_as_albumentations_draws_it():
    transforms = PixelTransforms(0.25)
    draws = 4000
    rng = np.random.default_rng(0)
    fired = np.zeros((draws, 4), bool)
    for row in range(draws):
        for transform, _ in transforms.draw(rng):
            fired[row, transforms.transforms.index(transform)] = True
    # Binomial(4000, 0.25): mean 1000, standard deviation 27.4; 5 deviations either side fail by chance with
    # probability ~6e-7 per transform. Independence: both of a pair fire with probability 1/16 (250, sd 15.3).
    assert (np.abs(fired.sum(0) - 1000) < 5 * 27.4).all(), fired.sum(0)
    assert abs((fired[:, 0] & fired[:, 3]).sum() - 250) < 5 * 15.3
    # What fires is applied in order, each seeded as drawn: the same as calling the transforms one by one.
    image = make_image(np.random.default_rng(1), 64)[0]
    every = PixelTransforms(1.0)
    drawn = every.draw(np.random.default_rng(2))
    assert [transform for transform, _ in drawn] == every.transforms
    expected = image
    for transform, seed in drawn:
        transform.set_random_seed(seed)
        expected = transform(image=expected)["image"]
    assert np.array_equal(every.apply(image, every.draw(np.random.default_rng(2))), expected)
    assert not np.array_equal(expected, image)
    # Whether or not any fires, an item draws the same count of numbers: what it draws next does not move.
    after = []
    for probability in (0.0001, 1.0):
        rng = np.random.default_rng(5)
        PixelTransforms(probability).draw(rng)
        after.append(rng.random())
    assert after[0] == after[1]


@pytest.mark.parametrize("user_value", [None, "0"])
def test_albumentations_is_imported_only_for_its_pipeline_and_without_the_update_check(user_value):
    """A fresh interpreter; an import hook records the variable at the moment albumentations is imported, which
    is when the pipeline is built, not when the module is (predict and val import it for the letterbox). The
    update check is off from the module's import on (loader workers inherit it), unless the user chose."""
    env = {k: v for k, v in os.environ.items() if k != "NO_ALBUMENTATIONS_UPDATE"}
    if user_value is not None:
        env["NO_ALBUMENTATIONS_UPDATE"] = user_value
    code = textwrap.dedent("""
        import os, sys
        seen = []
        class Spy:
            def find_spec(self, name, path=None, target=None):
                if name == "albumentations":
                    seen.append(os.environ.get("NO_ALBUMENTATIONS_UPDATE"))
        sys.meta_path.insert(0, Spy())
        import detector.data.augment
        assert "albumentations" not in sys.modules and not seen
        after_import = os.environ.get("NO_ALBUMENTATIONS_UPDATE")
        assert detector.data.augment.build_albumentations(0.5) is not None
        print(after_import, seen[0], os.environ["NO_ALBUMENTATIONS_UPDATE"])
    """)
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    expected = user_value or "1"
    assert result.stdout.split() == [expected] * 3


def test_mixup_blends_two_items_and_keeps_both_their_boxes(tmp_path):
    """MixUp (Ultralytics' mixup, as it blends: ``a * r + b * (1 - r)`` truncated, r ~ Beta(32, 32)): each image a
    flat grey of its own level and one box per index more than the last, no other change drawn, so each item is
    its own image blended with a partner's whose boxes come along. Off in close-mosaic epochs."""
    import cv2

    from detector.data.records import Records

    levels = [40, 90, 160, 220]
    paths, labels = [], []
    for index, level in enumerate(levels):
        paths.append(tmp_path / f"{index}.png")
        cv2.imwrite(str(paths[-1]), np.full((64, 64, 3), level, np.uint8))
        labels.append(np.array([[0, 0.1 + 0.15 * k, 0.5, 0.1, 0.1] for k in range(index + 1)], np.float32))
    records = Records.from_lists(paths, labels, range(4), [(64, 64)] * 4)
    still = dict(mosaic=0.0, translate=0.0, scale=0.0, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0, fliplr=0.0, albumentations=0.0)
    mixed = DetectionDataset(records, image_size=64, augment=AugmentConfig(mixup=1.0, **still), seed=3)
    plain = DetectionDataset(records, image_size=64, augment=AugmentConfig(**still), seed=3)
    for index in range(4):
        image, targets, _ = mixed[(index, 0, True)]
        partner = len(targets) - (index + 1) - 1  # index p holds p + 1 boxes
        assert 0 <= partner < 4, len(targets)
        own, other = levels[index], levels[partner]
        values = torch.unique(image)
        assert len(values) == 1  # a flat blend
        if own != other:
            ratio = (int(values) + 0.5 - other) / (own - other)  # the truncated blend, solved for r (+/- 0.5 level)
            assert 0.25 < ratio < 0.75, ratio  # Beta(32, 32) lies within 0.5 +/- 0.25 but for ~1e-4 of draws
        closing = (index, 0, False)  # a close-mosaic epoch: no MixUp
        assert torch.equal(mixed[closing][0], plain[closing][0]) and torch.equal(mixed[closing][1], plain[closing][1])


def test_a_long_thin_box_survives_a_warp_as_in_ultralytics():
    """Bars of aspect 25 and 89 keep their boxes through an identity warp (aspect 20 was the limit); one of 125 is
    dropped, as Ultralytics' ``box_candidates`` (``ar_thr=100``) drops it."""
    from detector.data.augment import warp_boxes

    bars = np.array([[5, 70, 155, 76], [5, 100, 630, 107], [5, 200, 630, 205]], np.float32)  # 150x6, 625x7, 625x5
    kept, classes = warp_boxes(bars, np.array([0, 1, 2], np.float32), np.eye(3), 1.0, 640)
    np.testing.assert_array_equal(kept, bars[:2])
    assert classes.tolist() == [0, 1]


def test_hsv_shifts_every_hue_alike_and_leaves_an_unchanged_image_alone():
    """The hue is shifted, as Ultralytics does since 8.3.79: multiplied (before), a red's hue near 0 never moved
    while hues near a full turn moved the most. Unchanged operations return the image itself: the uint8 HSV round
    trip alone moved a solid (220, 40, 40) to (220, 39, 39)."""
    image = np.zeros((2, 3, 3), np.uint8)
    image[:, 0], image[:, 1], image[:, 2] = (220, 40, 40), (40, 220, 40), (180, 40, 200)  # red, green, purple
    assert augment_hsv(image, HSV_UNCHANGED) is image
    hues = cv2.cvtColor(image, cv2.COLOR_RGB2HSV)[0, :, 0].astype(int)  # OpenCV units: 2 degrees, 180 a turn
    shifted = cv2.cvtColor(augment_hsv(image, (0.05, 1.0, 1.0)), cv2.COLOR_RGB2HSV)[0, :, 0].astype(int)
    # 0.05 turns = 9 units, each hue moved alike; one unit for uint8 rounding at each of the three conversions.
    assert (np.abs((shifted - hues) % 180 - 9) <= 2).all(), (hues, shifted)
    config = AugmentConfig(hsv_h=0.015, hsv_s=0.7, hsv_v=0.4)
    draws = np.array([draw_hsv(config, np.random.default_rng(seed)) for seed in range(200)])
    assert (np.abs(draws[:, 0]) <= 0.015).all() and (draws[:, 0] < 0).any() and (draws[:, 0] > 0).any()
    assert (np.abs(draws[:, 1] - 1) <= 0.7).all() and (np.abs(draws[:, 2] - 1) <= 0.4).all()
