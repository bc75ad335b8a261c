import colorsys
import math

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from detector.data.augment import AugmentConfig, augment_hsv
from detector.data.batch_augment import (
    TABLE_COLUMNS,
    PixelOps,
    apply_pixel_ops,
    carried_pixel_ops,
    pixel_ops_table,
    resolve_pixel_augment,
)
from detector.data.dataset import DetectionDataset, collate
from detector.data.synthetic import make_image
from detector.model import build_model
from detector.training.builders import build_data
from detector.training.config import TrainConfig
from detector.training.engine import train_one_epoch
from detector.training.step_input import as_trained, resize_batch, step_input
from detector.training.multiscale import MultiScale
from tests.conftest import make_train_step, write_records

EPS = torch.finfo(torch.float32).eps
# (hue shift in turns, saturation gain, value gain): draw_hsv gives +/- 0.015, 1 +/- 0.7, 1 +/- 0.4 by default; the
# last two sets go further (shifts of half a turn and of more than a turn back, saturation and value gains that clip).
HSV_SETS = [(0.0, 1.0, 1.0), (-0.015, 0.3, 0.6), (0.015, 1.7, 1.4), (0.5, 2.5, 0.05), (-1.3, 0.0, 3.0)]
MAX_HUE = 1 + max(abs(hsv[0]) for hsv in HSV_SETS)  # turns: a hue in [0, 1) plus its shift

# Float32 against exact arithmetic. Every float32 operation is off by at most eps/2 of the magnitude of its
# result. The hue (a quotient of channel differences plus a sector offset up to 4, /6, mod 1, plus the shift)
# passes through 8 operations on values up to MAX_HUE turns; hsv_to_rgb multiplies it by 6, so those count 6x.
# Then 3 operations on values up to 5 + 6 * MAX_HUE (the channel offset added, mod 6, 4 - k), and the output's
# v - v*s*f chain (s, v, their gains and products) about 8 operations on values up to 1. A channel moves at most
# 1 per unit of k (slope v*s <= 1), of s or of v.
FLOAT32_TOLERANCE = (6 * 8 * MAX_HUE + 3 * (5 + 6 * MAX_HUE) + 8) * EPS / 2


def _opencv_bound(result: torch.Tensor, hsv: torch.Tensor) -> torch.Tensor:
    """Per-pixel bound, in levels (0-255), on |augment_hsv (OpenCV uint8) - the float path|, ``[B, 1, H, W]``.

    ``result``: the float path's output, in levels; ``hsv``: ``[B, 3]`` (hue shift, saturation and value gains).

    OpenCV's 8-bit RGB2HSV (imgproc color_hsv) keeps V = max exactly; S and H go through 12-bit
    fixed-point reciprocal tables and are rounded to nearest. S = diff * (255 << 12) / V: the table entry is
    off by 0.5, times diff <= 255, over 2^12: S within 0.5 + 255 / 2^13 levels. H's numerator reaches
    5 * diff (the b-r+2*diff / r-g+4*diff sectors), so H is within 0.5 + 5 * 255 / 2^13 units, and a unit is
    2 degrees (hue is stored in [0, 180)). augment_hsv's lookup tables add the shift to the hue (its error carried
    as it is) and multiply saturation and value by their gains (scaling theirs), and truncate to uint8: up to one
    more unit or level, downwards. HSV2RGB computes in float and
    rounds: 0.5 level. A channel is v * (1 - s * clamp(min(k, 4 - k), 0, 1)): it moves at most one level per
    level of V or S (v, s <= 1), and the middle channel moves by chroma = max - min per 60 degrees of hue,
    where the chroma along the way is at most the float result's plus the V and S errors. A shifted hue has no
    discontinuity: the channels are continuous around the wrap, and the hue error is a distance around it.
    """
    hue_error_units = 0.5 + 5 * 255 / 2**13
    sat_levels = (0.5 + 255 / 2**13) * hsv[:, 1, None, None] + 1
    val_levels = 1.0
    hue_degrees = 2 * (hue_error_units + 1)
    chroma = result.amax(1) - result.amin(1) + val_levels + sat_levels
    bound = 0.5 + val_levels + sat_levels + chroma * hue_degrees / 60 + 255 * FLOAT32_TOLERANCE
    return bound[:, None]


def _reference_hsv(rgb: np.ndarray, hsv: tuple[float, float, float]) -> np.ndarray:
    """Float64 HSV shift and gains through :mod:`colorsys`, pixel by pixel: ``[3, H, W]`` in [0, 1]."""
    out = np.empty_like(rgb, dtype=np.float64)
    for y in range(rgb.shape[1]):
        for x in range(rgb.shape[2]):
            hue, sat, val = colorsys.rgb_to_hsv(*rgb[:, y, x].astype(np.float64))
            out[:, y, x] = colorsys.hsv_to_rgb((hue + hsv[0]) % 1.0, min(sat * hsv[1], 1.0), min(val * hsv[2], 1.0))
    return out


def _test_pixels(count: int = 4, size: int = 16, seed: int = 0) -> torch.Tensor:
    """uint8 ``[count, 3, size, size]``: random colours, greys, saturated colours and channel ties."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (count, 3, size, size), generator=generator, dtype=torch.uint8)
    images[:, :, 0] = images[:, :1, 0]  # a row of greys
    images[:, :, 1] = torch.tensor([255, 0, 0], dtype=torch.uint8)[:, None]  # pure red
    images[:, 1, 2] = images[:, 0, 2]  # red == green: ties between the largest channels
    images[:, :, 3, : size // 2] = 0  # black
    images[:, :, 3, size // 2 :] = 255  # white
    return images


def test_hsv_matches_float64_colorsys_within_float32_rounding():
    images = _test_pixels().float() / 255
    ops = [PixelOps(*hsv) for hsv in HSV_SETS[1:]]
    out = apply_pixel_ops(images, ops)
    for image, result, op in zip(images, out, ops):
        expected = _reference_hsv(image.double().numpy(), op.hsv)
        assert np.abs(result.double().numpy() - expected).max() <= FLOAT32_TOLERANCE, op


def test_hsv_matches_opencv_uint8_path_within_its_quantisation():
    rng = np.random.default_rng(0)
    photos = [make_image(rng, 32)[0] for _ in range(2)]  # smooth gradients, noise and antialiased shapes
    random = [image.permute(1, 2, 0).numpy() for image in _test_pixels(count=2, size=32)]
    for hsv in HSV_SETS:
        for image in photos + random:
            source = torch.from_numpy(image).permute(2, 0, 1)[None].float() / 255
            device = apply_pixel_ops(source, [PixelOps(*hsv)])
            expected = torch.from_numpy(augment_hsv(image, hsv)).permute(2, 0, 1)[None].float()
            error = (device * 255 - expected).abs()
            bound = _opencv_bound(device * 255, torch.tensor([hsv]))
            assert (error <= bound).all(), (hsv, (error - bound).max().item())


def test_flips_equal_torch_flip_per_image_and_keep_the_memory_format():
    images = (_test_pixels(count=5).float() / 255).contiguous(memory_format=torch.channels_last)
    flips = [(False, False), (True, False), (False, True), (True, True), (True, False)]
    out = apply_pixel_ops(images, [PixelOps(flip_lr=lr, flip_ud=ud) for lr, ud in flips])
    assert out.is_contiguous(memory_format=torch.channels_last)
    for image, result, (lr, ud) in zip(images, out, flips):
        dims = [dim for dim, on in ((2, lr), (1, ud)) if on]
        assert torch.equal(result, image.flip(dims) if dims else image)
    assert torch.equal(images, _test_pixels(count=5).float() / 255), "the input batch must not change"
    # With HSV too: the flips move the HSV result's pixels, nothing else.
    gained = apply_pixel_ops(images, [PixelOps(*HSV_SETS[2], flip_lr=lr, flip_ud=ud) for lr, ud in flips])
    unflipped = apply_pixel_ops(images, [PixelOps(*HSV_SETS[2])] * len(flips))
    for result, plain, (lr, ud) in zip(gained, unflipped, flips):
        dims = [dim for dim, on in ((2, lr), (1, ud)) if on]
        torch.testing.assert_close(result, plain.flip(dims) if dims else plain, rtol=0, atol=FLOAT32_TOLERANCE)


def test_the_channel_swap_reverses_the_channels_last_per_image_and_exactly():
    """--bgr's swap after HSV and the flips: the image's channels in the other order, values untouched."""
    images = (_test_pixels(count=4).float() / 255).contiguous(memory_format=torch.channels_last)
    ops = [PixelOps(*HSV_SETS[2], flip_lr=True), PixelOps(*HSV_SETS[1], flip_ud=True), PixelOps(),
           PixelOps(*HSV_SETS[3])]
    swapped = [PixelOps(*op.hsv, flip_lr=op.flip_lr, flip_ud=op.flip_ud, swap_channels=index != 2)
               for index, op in enumerate(ops)]
    plain, out = apply_pixel_ops(images, ops), apply_pixel_ops(images, swapped)
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(out[[0, 1, 3]], plain[[0, 1, 3]].flip(1)) and torch.equal(out[2], plain[2])
    assert torch.equal(images, (_test_pixels(count=4).float() / 255)), "the input batch must not change"
    table = pixel_ops_table(swapped, torch.device("cpu"))
    assert table.shape == (4, TABLE_COLUMNS) and table[:, 5].tolist() == [1.0, 1.0, 0.0, 1.0]


def _datasets(records, **augment):
    config = AugmentConfig(flipud=0.5, **augment)
    workers = DetectionDataset(records, image_size=64, augment=config, seed=3)
    device = DetectionDataset(records, image_size=64, augment=config, seed=3, pixel_ops_on_device=True)
    return workers, device


KEYS = [(index, epoch, use_mosaic) for index in range(4) for epoch in range(3) for use_mosaic in (True, False)]


def test_device_path_items_have_the_worker_paths_labels_exactly(tmp_path):
    workers, device = _datasets(write_records(tmp_path, 4, seed=1), albumentations=0.5)  # its seed is drawn too
    flips = set()
    for key in KEYS:
        _, worker_labels, worker_meta = workers[key]
        _, device_labels, device_meta = device[key]
        assert torch.equal(device_labels, worker_labels), key
        assert worker_meta.pixel_ops is None and device_meta.pixel_ops is not None
        flips.add((device_meta.pixel_ops.flip_lr, device_meta.pixel_ops.flip_ud))
    assert len(flips) == 4, "every flip combination should occur among these keys"


@pytest.mark.parametrize("bgr", [0.0, 0.5])  # at 0.5, items with the channel swap and items without
def test_device_path_pixels_after_apply_match_the_worker_path(tmp_path, bgr):
    # No albumentations here: on the device path they run before HSV instead of after.
    workers, device = _datasets(write_records(tmp_path, 4, seed=1), albumentations=0.0, bgr=bgr)
    worker_images, _, _ = collate([workers[key] for key in KEYS])
    device_images, _, metas = collate([device[key] for key in KEYS])
    ops = carried_pixel_ops([meta.pixel_ops for meta in metas])
    assert {op.swap_channels for op in ops} == ({False, True} if bgr else {False})
    source = device_images.float() / 255
    out = apply_pixel_ops(source, ops)
    assert out.min() >= 0 and out.max() <= 1
    error = (out * 255 - worker_images.float()).abs()
    bound = _opencv_bound(out * 255, torch.tensor([op.hsv for op in ops]))
    assert (error <= bound).all(), (error - bound).max().item()


def test_step_input_applies_pixel_ops_before_the_resize_on_a_cpu_tensor():
    images = _test_pixels(count=2, size=64).contiguous(memory_format=torch.channels_last)
    ops = [PixelOps(*HSV_SETS[2], flip_lr=True), PixelOps(*HSV_SETS[1], flip_ud=True)]
    out = step_input(images, 96, torch.device("cpu"), channels_last=True, pixel_ops=ops)
    assert out.shape == (2, 3, 96, 96) and out.dtype == torch.float32
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert out.min() >= 0 and out.max() <= 1
    assert torch.equal(out, resize_batch(apply_pixel_ops(images.float() / 255, ops), 96))
    # Without operations the CPU path is the one it always was.
    plain = step_input(images, 96, torch.device("cpu"), channels_last=True)
    assert torch.equal(plain, step_input(images, 96, torch.device("cpu"), channels_last=True, pixel_ops=None))


def test_as_trained_applies_and_clears_the_carried_ops(tmp_path):
    workers, device = _datasets(write_records(tmp_path, 2, seed=2), albumentations=0.0)
    batch = collate([device[(index, 0, True)] for index in range(2)])
    images, targets, metas = as_trained(batch)
    ops = [meta.pixel_ops for meta in batch[2]]
    expected = (apply_pixel_ops(batch[0].float() / 255, ops) * 255).round().to(torch.uint8)
    assert torch.equal(images, expected) and images.is_contiguous(memory_format=torch.channels_last)
    assert all(meta.pixel_ops is None for meta in metas) and targets is batch[1]
    plain = collate([workers[(index, 0, True)] for index in range(2)])
    assert as_trained(plain) is plain


def test_pixel_augment_auto_is_device_on_cuda_and_workers_elsewhere(yolo_yaml):
    assert resolve_pixel_augment("auto", torch.device("cpu")) == "workers"
    assert resolve_pixel_augment("auto", torch.device("cuda", 0)) == "device"
    assert resolve_pixel_augment("device", torch.device("cpu")) == "device"
    assert resolve_pixel_augment("workers", torch.device("cuda")) == "workers"
    assert resolve_pixel_augment("pixels", torch.device("cuda")) == "pixels"
    with pytest.raises(ValueError, match="--pixel-augment"):
        resolve_pixel_augment("gpu", torch.device("cpu"))
    # (pixel ops on the device, mosaic and affine on the device)
    for choice, where in (("auto", (False, False)), ("pixels", (True, False)), ("device", (True, True))):
        config = TrainConfig(data=str(yolo_yaml), imgsz=64, cache="none", pixel_augment=choice)
        _, train, _ = build_data(config, with_val=False, device=torch.device("cpu"))
        assert (train.dataset.pixel_ops_on_device, train.dataset.geometry_on_device) == where, choice


def test_train_one_epoch_on_the_device_path_gives_finite_losses(tmp_path):
    _, device_dataset = _datasets(write_records(tmp_path, 4, seed=3))
    loader = DataLoader([device_dataset[(index, 0, True)] for index in range(4)], batch_size=2, collate_fn=collate)
    torch.manual_seed(0)
    model = build_model(num_classes=3)
    step = make_train_step(model, channels_last=True)
    stats = train_one_epoch(step, loader, multi_scale=MultiScale(64, low=0.5, hold=1), epoch=0, seed=0,
                            progress=False)
    assert stats["optimizer_steps"] == 2 and stats["skipped_steps"] == 0
    assert all(math.isfinite(stats[k]) and stats[k] > 0 for k in ("train/box", "train/cls", "train/dfl"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    images = _test_pixels(count=4, size=32).float().div(255).contiguous(memory_format=torch.channels_last)
    ops = [PixelOps(*hsv, flip_lr=index % 2 == 0, flip_ud=index == 3) for index, hsv in enumerate(HSV_SETS[1:])]
    on_cuda = apply_pixel_ops(images.cuda(), ops)
    assert on_cuda.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(on_cuda.cpu(), apply_pixel_ops(images, ops), rtol=0, atol=2 * FLOAT32_TOLERANCE)
