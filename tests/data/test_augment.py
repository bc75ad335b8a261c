import dataclasses
import importlib.util
import math
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
    PAD_VALUE,
    AugmentConfig,
    PixelTransforms,
    affine_matrix,
    augment_hsv,
    draw_channel_swap,
    draw_hsv,
    is_affine,
    mosaic,
    random_affine,
    swap_channels,
    warp_boxes,
    warp_image,
    warped_extent,
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


def _affine_before_perspective(height, width, out_size, config, rng):
    """affine_matrix as it was before --perspective (its six draws, in order): what p = 0 must still give."""
    to_origin = np.array([[1, 0, -width / 2], [0, 1, -height / 2], [0, 0, 1]], np.float64)
    angle = rng.uniform(-config.degrees, config.degrees)
    zoom = rng.uniform(1 - config.scale, 1 + config.scale) * out_size / max(height, width) * (
        2 if height >= 2 * out_size else 1)
    rotate = np.eye(3)
    rotate[:2] = cv2.getRotationMatrix2D((0, 0), angle, zoom)
    shear = np.eye(3)
    shear[0, 1] = math.tan(math.radians(rng.uniform(-config.shear, config.shear)))
    shear[1, 0] = math.tan(math.radians(rng.uniform(-config.shear, config.shear)))
    to_output = np.eye(3)
    to_output[0, 2] = rng.uniform(0.5 - config.translate, 0.5 + config.translate) * out_size
    to_output[1, 2] = rng.uniform(0.5 - config.translate, 0.5 + config.translate) * out_size
    return to_output @ shear @ rotate @ to_origin, zoom


def _boxes_before_perspective(boxes, matrix):
    """warp_boxes' corner arithmetic as it was before --perspective (no division), before the clip."""
    corners = boxes[:, [0, 1, 2, 3, 0, 3, 2, 1]].reshape(-1, 2)
    corners = (np.concatenate((corners, np.ones((len(corners), 1))), 1) @ matrix.T)[:, :2].reshape(-1, 8)
    xs, ys = corners[:, 0::2], corners[:, 1::2]
    return np.stack((xs.min(1), ys.min(1), xs.max(1), ys.max(1)), 1).astype(np.float32)


def test_the_channel_swap_draws_nothing_at_0_and_one_number_with_its_probability_above():
    """--bgr 0 (the default) leaves the generator where it was, so items augment as before the option existed;
    above 0 one uniform draw, the swap where it falls below --bgr (Ultralytics' bgr)."""
    for bgr, swaps, draws in ((0.0, False, 0), (1.0, True, 1), (1e-9, False, 1)):
        ours, plain = np.random.default_rng(0), np.random.default_rng(0)
        assert draw_channel_swap(AugmentConfig(bgr=bgr), ours) is swaps
        plain.random(draws)
        assert ours.random() == plain.random(), bgr  # exactly `draws` numbers taken
    rng = np.random.default_rng(1)
    share = np.mean([draw_channel_swap(AugmentConfig(bgr=0.3), rng) for _ in range(4000)])
    assert abs(share - 0.3) <= 4 * math.sqrt(0.3 * 0.7 / 4000)  # four binomial standard deviations
    image = rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)
    swapped = swap_channels(image, True)
    assert swapped.flags.c_contiguous and np.array_equal(swapped, image[:, :, [2, 1, 0]])
    assert swap_channels(image, False) is image


SHAPES = [(128, 128), (48, 64), (64, 40)]  # a 2x mosaic canvas of 64, and single images of either orientation


def _random_boxes(rng, height, width, count=6):
    xy = rng.uniform(0, [width, height], (count, 2))
    return np.concatenate((xy, xy + rng.uniform(3, 30, (count, 2))), 1).astype(np.float32)


@pytest.mark.parametrize("seed", range(4))
def test_no_perspective_draws_warps_and_moves_boxes_bit_for_bit_as_before(seed):
    config = AugmentConfig(degrees=10, shear=3, translate=0.2, scale=0.5, perspective=0.0)
    for height, width in SHAPES:
        ours, before = np.random.default_rng(seed), np.random.default_rng(seed)
        matrix, zoom = affine_matrix(height, width, 64, config, ours)
        expected, expected_zoom = _affine_before_perspective(height, width, 64, config, before)
        assert np.array_equal(matrix, expected) and zoom == expected_zoom and is_affine(matrix)
        assert ours.random() == before.random()  # nothing more drawn: every later draw stays where it was
        image = ours.integers(0, 256, (height, width, 3), dtype=np.uint8)
        assert np.array_equal(warp_image(image, matrix, 64), cv2.warpAffine(image, matrix[:2], (64, 64),
                                                                              borderValue=(PAD_VALUE,) * 3))
        boxes = _random_boxes(ours, height, width)
        assert np.array_equal(warped_extent(boxes, matrix, 64), _boxes_before_perspective(boxes, matrix))


def test_perspective_draws_two_more_numbers_after_the_six_and_tilts_the_centred_canvas():
    """M = T S R P C (Ultralytics' order) with P's x and y coefficients the 7th and 8th draws, U(-p, p)."""
    config = AugmentConfig(degrees=10, shear=3, perspective=0.001)
    for seed, (height, width) in enumerate(SHAPES):
        ours, plain = np.random.default_rng(seed), np.random.default_rng(seed)
        matrix, zoom = affine_matrix(height, width, 64, config, ours)
        affine, affine_zoom = affine_matrix(height, width, 64, dataclasses.replace(config, perspective=0.0), plain)
        tilt = np.eye(3)
        tilt[2, 0], tilt[2, 1] = plain.uniform(-0.001, 0.001), plain.uniform(-0.001, 0.001)
        assert ours.random() == plain.random() and zoom == affine_zoom
        centre = np.array([[1, 0, -width / 2], [0, 1, -height / 2], [0, 0, 1]])
        expected = affine @ np.linalg.inv(centre) @ tilt @ centre
        # Entries below 1e3 in magnitude (translations up to the 64-px output, or the canvas half-size); each side
        # is a few 3x3 products and an exact inverse of a translation: about 16 float64 roundings of such values.
        assert np.abs(matrix - expected).max() <= 16 * 1e3 * np.finfo(np.float64).eps
        assert not is_affine(matrix) and np.all(np.abs(matrix[2, :2]) <= 0.001 * (1 + 1e-12))


# OpenCV's warp places a sample within 1/64 px (its 1/32-px table: INTER_BITS = 5) plus 2/2048 px of its own
# rounding of each coordinate (see tests/data/test_device_augment.py, OPENCV_POSITION_PX); its uint8 result is
# rounded by at most half a level, moving a threshold at half of 255 by 0.5 / 255 px of an edge. All in source
# pixels, times the warp's local scale: below 1.5 in the test below (zoom 1; the rectangle lies within 36 px of
# the centre on each axis, so at p = 0.002 w = 1 + a x + b y is within 1 +/- 0.14, and the derivative of X / w,
# 1 / w + |X a| / w**2 with |X| < 40, below 1 / 0.86 + 40 * 0.002 / 0.74 = 1.27). A pixel read as inside the
# rectangle lies within WHITE_TOLERANCE_PX of its exact image.
WHITE_TOLERANCE_PX = 1.5 * (1 / 64 + 2 / 2048 + 0.5 / 255)


def _white_rectangle(rectangle: tuple[int, int, int, int], size: int = 128) -> tuple[np.ndarray, np.ndarray]:
    """A black ``size`` square with a white rectangle of pixels ``[x1, x2) x [y1, y2)``, and its box: in OpenCV's
    coordinates (pixel i at i) those pixels cover ``[x1 - 0.5, x2 - 0.5]``, the box a warp moves."""
    x1, y1, x2, y2 = rectangle
    image = np.zeros((size, size, 3), np.uint8)
    image[y1:y2, x1:x2] = 255
    return image, np.array([[x1 - 0.5, y1 - 0.5, x2 - 0.5, y2 - 0.5]], np.float32)


def _white_pixels(image: np.ndarray, matrix: np.ndarray, size: int = 128) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of the output pixels at least half white: their source point lies inside the rectangle."""
    warped = cv2.warpPerspective(image, matrix, (size, size), borderValue=(0, 0, 0))
    ys, xs = np.nonzero(warped[..., 0] >= 128)
    return xs, ys


def test_a_perspective_warp_is_opencvs_and_boxes_enclose_their_corners_divided_by_w():
    config = AugmentConfig(degrees=5, scale=0.0, perspective=0.002)  # twice Ultralytics' 0.001: more to see
    for seed in range(3):
        matrix, zoom = affine_matrix(128, 128, 128, config, np.random.default_rng(seed))
        image, box = _white_rectangle((30, 40, 90, 100))
        assert np.array_equal(warp_image(image, matrix, 128), cv2.warpPerspective(image, matrix, (128, 128),
                                                                                  borderValue=(PAD_VALUE,) * 3))
        corners = cv2.perspectiveTransform(box[:, [0, 1, 2, 1, 2, 3, 0, 3]].reshape(1, 4, 2).astype(np.float64), matrix)
        expected = np.concatenate((corners[0].min(0), corners[0].max(0)))
        # Both in float64 (OpenCV's own code there), a few roundings of 1e-16 apart, then ours rounded once to
        # float32: at most half an ulp, eps / 2 relative; eps leaves room for a value at a rounding boundary.
        np.testing.assert_allclose(warped_extent(box, matrix, 128)[0], expected, rtol=np.finfo(np.float32).eps)
        xs, ys = _white_pixels(image, matrix)
        x1, y1, x2, y2 = expected
        tol = WHITE_TOLERANCE_PX
        assert x1 - tol <= xs.min() and xs.max() <= x2 + tol and y1 - tol <= ys.min() and ys.max() <= y2 + tol
        # Tight too: a pixel whose source point is 0.5 px inside both edges is all white, and the lattice has one
        # within a pixel of that point in each axis; 0.5 px source is under 0.75 px here (local scale < 1.5).
        assert xs.min() <= x1 + 1.75 and xs.max() >= x2 - 1.75 and ys.min() <= y1 + 1.75 and ys.max() >= y2 - 1.75
        kept, _ = warp_boxes(box, np.zeros(1, np.float32), matrix, zoom, 128)
        np.testing.assert_array_equal(kept, warped_extent(box, matrix, 128).clip(0, 128))


def test_a_box_the_horizon_cuts_is_bounded_by_the_part_in_the_output():
    """A tilt strong enough for the line w = 0 to cross a box (the canvas corner of a 1280-px mosaic at p = 0.001
    and zoom 0.5 sees it too): Ultralytics' box of the divided corners covers the whole output, though the object
    lies in its lower right; here the part with w > 0 bounds it, and the part with w < 0 lands outside."""
    centre, tilt = np.array([[1, 0, -64], [0, 1, -64], [0, 0, 1.0]]), np.eye(3)
    tilt[2, :2] = -0.012  # w = 0 on x + y = 83 from the centre
    matrix = np.linalg.inv(centre) @ tilt @ centre
    image, box = _white_rectangle((60, 60, 128, 128))
    mapped = np.concatenate((box[:, [0, 1, 2, 3, 0, 3, 2, 1]].reshape(4, 2), np.ones((4, 1))), 1) @ matrix.T
    assert mapped[:, 2].min() < 0 < mapped[:, 2].max()
    divided = mapped[:, :2] / mapped[:, 2:]
    assert (divided.min(0) < 0).all() and (divided.max(0) > 128).all()  # Ultralytics' box: all of the output
    xs, ys = _white_pixels(image, matrix)
    x1, y1, x2, y2 = warped_extent(box, matrix, 128)[0]
    # Its w > 0 part runs to infinity towards the lower right (the output's edge, once clipped); up and left, its
    # corners with w > 0 bound it. Near w = 0 the warp magnifies 10x and more, so no pixel tolerance applies:
    # the white pixels start 8 px inside the box (57 against 48.6), far beyond any rounding.
    assert (x2, y2) == (128, 128)
    assert np.array_equal((x1, y1), divided[mapped[:, 2] > 0].min(0).astype(np.float32))
    assert x1 < xs.min() and y1 < ys.min() and xs.min() - x1 > 8


# The child: Ultralytics' RandomPerspective.apply_bboxes on the saved boxes and matrices (perspective on, so it
# divides by w as ours does).
BOX_ORACLE = """
import sys
import numpy as np
from ultralytics.data.augment import RandomPerspective

cases = np.load(sys.argv[1])
transform = RandomPerspective(perspective=0.001)
np.save(sys.argv[2], np.stack([transform.apply_bboxes(cases["boxes"], matrix) for matrix in cases["matrices"]]))
"""


def test_boxes_move_as_ultralytics_moves_them(tmp_path):
    if importlib.util.find_spec("ultralytics") is None:  # looked for, not imported: it patches the process
        pytest.skip("ultralytics (the dev extra) is not installed")
    rng = np.random.default_rng(0)
    config = AugmentConfig(degrees=10, shear=3, translate=0.2, perspective=0.001)
    matrices = np.stack([affine_matrix(128, 128, 64, config, rng)[0] for _ in range(8)])
    boxes = _random_boxes(rng, 128, 128, count=20)
    np.savez(tmp_path / "cases.npz", boxes=boxes, matrices=matrices)
    env = {**os.environ, "YOLO_OFFLINE": "1", "YOLO_CONFIG_DIR": str(tmp_path)}
    command = [sys.executable, "-c", BOX_ORACLE, str(tmp_path / "cases.npz"), str(tmp_path / "theirs.npy")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    theirs = np.load(tmp_path / "theirs.npy")
    for matrix, expected in zip(matrices, theirs):
        # No box here meets the horizon (w stays within 1 +/- 0.13 on a 128 canvas). Both multiply the same float64
        # rows by the same float64 matrix, divide, take the extremes and round to float32: the same numbers.
        np.testing.assert_array_equal(warped_extent(boxes, matrix, 64), expected)


@pytest.mark.parametrize("perspective", [0.0, 0.0005, 0.012])
def test_a_square_given_as_height_and_width_warps_bit_for_bit_as_the_square(perspective):
    """--rect generalised the warp to a (height, width) output; the square given either way draws, warps and moves
    boxes the same, bit for bit (every item but --rect's passes the side alone). 0.012 tilts boxes across the
    horizon (the split extent, clipped to the output)."""
    config = AugmentConfig(degrees=10, shear=3, translate=0.2, scale=0.5, perspective=perspective)
    for height, width in SHAPES:
        for seed in range(3):
            side, pair = np.random.default_rng(seed), np.random.default_rng(seed)
            matrix, zoom = affine_matrix(height, width, 64, config, side)
            matrix_hw, zoom_hw = affine_matrix(height, width, (64, 64), config, pair)
            assert np.array_equal(matrix, matrix_hw) and zoom == zoom_hw and side.random() == pair.random()
            image = side.integers(0, 256, (height, width, 3), dtype=np.uint8)
            assert np.array_equal(warp_image(image, matrix, 64), warp_image(image, matrix, (64, 64)))
            boxes = _random_boxes(side, height, width, count=12)
            assert np.array_equal(warped_extent(boxes, matrix, 64), warped_extent(boxes, matrix, (64, 64)))
            for ours, theirs in zip(warp_boxes(boxes, np.arange(12.0), matrix, zoom, 64),
                                    warp_boxes(boxes, np.arange(12.0), matrix, zoom, (64, 64))):
                assert np.array_equal(ours, theirs)


def test_a_canvas_warp_centres_the_image_shifts_by_each_side_and_clips_boxes_to_it():
    """Into a 48x64 canvas (height x width): the image's centre goes to (0.5 +/- translate) of each side, the zoom is
    relative to the canvas's long side (--imgsz), and boxes are clipped to 64 wide, 48 tall."""
    config = AugmentConfig(translate=0.2, scale=0.5)
    for seed in range(8):
        rng = np.random.default_rng(seed)
        matrix, zoom = affine_matrix(40, 64, (48, 64), config, rng)
        centre = matrix @ [32, 20, 1]
        assert 0.3 * 64 <= centre[0] <= 0.7 * 64 and 0.3 * 48 <= centre[1] <= 0.7 * 48 and 0.5 <= zoom <= 1.5
        image = rng.integers(0, 256, (40, 64, 3), dtype=np.uint8)
        assert warp_image(image, matrix, (48, 64)).shape == (48, 64, 3)
        boxes = np.array([[0, 0, 64, 40], [30, 10, 50, 30]], np.float32)
        kept, _ = warp_boxes(boxes, np.zeros(2, np.float32), matrix, zoom, (48, 64))
        assert (kept[:, [0, 2]] >= 0).all() and (kept[:, [0, 2]] <= 64).all()
        assert (kept[:, [1, 3]] >= 0).all() and (kept[:, [1, 3]] <= 48).all()
        # The whole image's box: its corners about the centre at the zoom (no rotation or shear), cut at the edges.
        whole = np.array([centre[0] - 32 * zoom, centre[1] - 20 * zoom, centre[0] + 32 * zoom, centre[1] + 20 * zoom])
        np.testing.assert_allclose(kept[0], whole.clip(0, [64, 48, 64, 48]), rtol=1e-6, atol=1e-5)


# The child: Ultralytics' RandomPerspective.get_params for an image in a rect batch (its rect_shape), its
# random.uniform answering with the numbers our draws gave, in its own order of draws.
RECT_ORACLE = """
import random
import sys
import numpy as np
from ultralytics.data.augment import RandomPerspective

cases = np.load(sys.argv[1])
transform = RandomPerspective(degrees=10, translate=0.2, scale=0.5, shear=3, perspective=0.0005, size=(64, 64))
matrices = []
for draws, shape, canvas in zip(cases["draws"], cases["shapes"], cases["canvases"]):
    answers = iter(draws.tolist())
    random.uniform = lambda low, high: next(answers)
    params = transform.get_params({"img": np.zeros((*shape, 3), np.uint8), "rect_shape": canvas})
    matrices.append(params["M"])
np.save(sys.argv[2], np.stack(matrices))
"""


def test_a_canvas_matrix_is_ultralytics_rect_matrix(tmp_path):
    """An image (long side 64) in its rect batch's canvas: Ultralytics' RandomPerspective (with the batch's
    rect_shape, which takes precedence over its square size) builds the same matrix from the same numbers. It draws
    the perspective pair first, we last (so that a run without perspective draws as before): the child is given
    ours in its order."""
    if importlib.util.find_spec("ultralytics") is None:  # looked for, not imported: it patches the process
        pytest.skip("ultralytics (the dev extra) is not installed")
    config = AugmentConfig(degrees=10, translate=0.2, scale=0.5, shear=3, perspective=0.0005)
    cases = [((48, 64), (64, 64)), ((40, 64), (64, 64)), ((64, 40), (64, 64)), ((48, 64), (48, 64)),
             ((40, 64), (40, 64)), ((64, 40), (64, 48))]  # (image, canvas) as (height, width); canvases of rect_batches
    ours, draws = [], []
    for seed, (shape, canvas) in enumerate(cases):
        ours.append(affine_matrix(*shape, canvas, config, np.random.default_rng(seed))[0])
        again = np.random.default_rng(seed)  # the same numbers, drawn in our order (angle, zoom, shears, shifts, tilt)
        numbers = [again.uniform(-10, 10), again.uniform(0.5, 1.5), again.uniform(-3, 3), again.uniform(-3, 3),
                   again.uniform(0.3, 0.7), again.uniform(0.3, 0.7), again.uniform(-5e-4, 5e-4),
                   again.uniform(-5e-4, 5e-4)]
        draws.append(numbers[6:] + numbers[:6])  # theirs: the tilt first
    np.savez(tmp_path / "cases.npz", draws=np.array(draws), shapes=np.array([shape for shape, _ in cases]),
             canvases=np.array([canvas for _, canvas in cases]))
    env = {**os.environ, "YOLO_OFFLINE": "1", "YOLO_CONFIG_DIR": str(tmp_path)}
    command = [sys.executable, "-c", RECT_ORACLE, str(tmp_path / "cases.npz"), str(tmp_path / "theirs.npy")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    # Theirs is made of float32 matrices (ours float64): five 3x3 factors, a few float32 roundings (eps 1.2e-7) per
    # entry on the way; 1e-5 relative leaves room, and the perspective row (~5e-4) gets an absolute 1e-9.
    np.testing.assert_allclose(np.stack(ours), np.load(tmp_path / "theirs.npy"), rtol=1e-5, atol=1e-9)
