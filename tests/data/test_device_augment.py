import dataclasses
import math

import cv2
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from detector.data.augment import PAD_VALUE, AugmentConfig, mosaic_placements, mosaic_tiles, paste
from detector.data.batch_augment import PixelOps, apply_pixel_ops
from detector.data.dataset import DetectionDataset, collate
from detector.data.device_augment import WarpBatch, WarpSource, canvas_region, pack_warp_batch, render, render_uint8, shelf_pack
from detector.data.synthetic import make_image
from detector.model import build_model
from detector.training.engine import train_one_epoch
from detector.training.step_input import as_trained, step_input
from detector.training.multiscale import MultiScale
from tests.conftest import make_train_step, write_records

EPS = torch.finfo(torch.float32).eps

# Where the OpenCV warp may put a sample. OpenCV up to 4.10 (fixed point, imgproc/imgwarp.cpp): each source
# coordinate is the sum of two terms rounded to 1/1024 px (AB_BITS = 10), then cut to 1/32 px (INTER_BITS = 5)
# with a rounding offset: within 1/64 + 2/2048 px of the exact value, per axis. OpenCV 4.11 and later (and 5)
# warp in float32: a few float32 ulps of coordinates below 2 * 640, far inside the same bound.
OPENCV_POSITION_PX = 1 / 64 + 2 / 2048
# OpenCV's fixed-point weights: the four products rounded to 1/32768 (INTER_REMAP_COEF_BITS = 15), the largest
# corrected so they sum to one: at most 0.5 + 0.5 + 0.5 + 2.5 = 4 units off in all, on values up to 255.
OPENCV_WEIGHTS_LEVELS = 255 * 4 / 2**15
OPENCV_ROUNDING_LEVELS = 0.5  # the result is rounded to uint8
# The device path's float32 arithmetic on its weights: a handful of roundings of values up to 255.
DEVICE_WEIGHTS_LEVELS = 16 * 255 * EPS


def device_position_px(batch: WarpBatch) -> float:
    """How far float32 may move a device sample, in atlas pixels.

    Normalised coordinates lie within about 3 of 0 (the clamp keeps them in [-1, 1]); affine_grid's base grid,
    theta's entries and its three-term product, and grid_sample's unnormalising ``((n + 1) * W - 1) / 2`` round
    about 8 times, each by at most eps/2 of a value up to 3, times W/2 pixels per normalised unit: 8 eps W.
    """
    return 8 * EPS * max(batch.atlas.shape[:2])


def interpolation_bound(source: np.ndarray, to_source: np.ndarray, size: int, position_px: float) -> np.ndarray:
    """Per output pixel, in levels: how far two bilinear warps of ``source`` (fill outside) may differ.

    ``to_source``: output pixels -> source pixels (float64, exact). The two warps place each sample within
    ``position_px`` per axis of the exact point ``q``. Bilinear interpolation is continuous, and inside a cell
    its x-derivative is a blend of the cell's two horizontal neighbour differences (likewise y): so moving the
    point by ``d`` changes the value by at most ``d * (Gx + Gy)``, with ``Gx``/``Gy`` the largest horizontal/
    vertical difference of adjacent pixels in the cells the move crosses. With ``d < 1`` those cells lie in
    the 4x4 pixels from ``floor(q) - 1``. Tile edges, fill and the canvas border are pixels like any other
    here, so the bound holds for every pixel, border pixels included. Both sides' weights and rounding add a
    constant.
    """
    padded = np.pad(source.astype(np.float64), ((3, 3), (3, 3), (0, 0)), constant_values=PAD_VALUE)
    grad_x = np.abs(np.diff(padded, axis=1)).max(2)  # [H + 6, W + 5]
    grad_y = np.abs(np.diff(padded, axis=0)).max(2)  # [H + 5, W + 6]
    window = np.lib.stride_tricks.sliding_window_view
    max_x, max_y = window(grad_x, (4, 4)).max((2, 3)), window(grad_y, (4, 4)).max((2, 3))
    ys, xs = np.mgrid[0:size, 0:size].astype(np.float64)
    q = np.einsum("ij,jhw->ihw", to_source, np.stack((xs, ys, np.ones_like(xs))))
    # Window origin floor(q) - 1, + 3 for the padding; points beyond the pad read the fill-only edge (or the
    # edge pixels' gradient: more, never less).
    cols = np.floor(q[0]).astype(np.int64) + 2
    rows = np.floor(q[1]).astype(np.int64) + 2
    slope = (max_x[rows.clip(0, max_x.shape[0] - 1), cols.clip(0, max_x.shape[1] - 1)]
             + max_y[rows.clip(0, max_y.shape[0] - 1), cols.clip(0, max_y.shape[1] - 1)])
    constant = OPENCV_ROUNDING_LEVELS + OPENCV_WEIGHTS_LEVELS + DEVICE_WEIGHTS_LEVELS
    return constant + (OPENCV_POSITION_PX + position_px) * slope


def _tiles(rng: np.random.Generator, size: int) -> list[np.ndarray]:
    """Four tiles: noise (the steepest edges), a synthetic photo, a flat colour and a ramp; various shapes."""
    noise = rng.integers(0, 256, (size * 3 // 4, size, 3), dtype=np.uint8)
    photo = make_image(rng, size)[0][: size // 2 + 5]
    flat = np.full((size, size // 3, 3), (200, 30, 90), np.uint8)
    ramp = np.repeat(np.linspace(0, 255, size, dtype=np.uint8)[None, :, None], size, 0).repeat(3, 2)
    return [noise, photo, flat, ramp]


def _matrix(size: int, canvas: int, *, zoom: float, degrees: float, shear: float, shift: tuple[float, float]):
    """A fixed affine (the random_affine form): canvas pixels -> output pixels."""
    to_origin = np.array([[1, 0, -canvas / 2], [0, 1, -canvas / 2], [0, 0, 1]], np.float64)
    rotate = np.eye(3)
    rotate[:2] = cv2.getRotationMatrix2D((0, 0), degrees, zoom)
    skew = np.eye(3)
    skew[0, 1] = math.tan(math.radians(shear))
    to_output = np.array([[1, 0, shift[0] * size], [0, 1, shift[1] * size], [0, 0, 1]], np.float64)
    return to_output @ skew @ rotate @ to_origin


# Zoom below and above 1, rotation, shear, and shifts that take the output past the canvas edge.
CASES = [dict(zoom=0.5, degrees=0.0, shear=0.0, shift=(0.5, 0.5)), dict(zoom=1.37, degrees=17.0, shear=5.0, shift=(0.4, 0.6)),
         dict(zoom=0.8, degrees=-30.0, shear=-8.0, shift=(0.1, 0.9)), dict(zoom=1.0, degrees=90.0, shear=0.0, shift=(0.5, 0.5))]


def _fixed_sources(size: int):
    """Mosaics with fixed tiles, centres and matrices: (canvas, matrix, WarpSource) per case."""
    rng = np.random.default_rng(7)
    cases = []
    for case in CASES:
        tiles = mosaic_tiles(*(lambda images: (images, mosaic_placements([t.shape[:2] for t in images], size, rng)))(
            _tiles(rng, size)))
        matrix = _matrix(size, 2 * size, **case)
        cases.append((paste(tiles, 2 * size, 2 * size), matrix, canvas_region(tiles, 2 * size, 2 * size, matrix, size)))
    return cases


@pytest.mark.parametrize("scale", [1.0, 0.875, 1.125])  # the output size itself, and multi-scale sizes folded in
def test_device_warp_matches_opencv_within_the_interpolation_bound(scale):
    size = 64
    cases = _fixed_sources(size)
    batch = pack_warp_batch([source for _, _, source in cases])
    out_size = round(size * scale)
    device = render(batch, torch.device("cpu"), size=out_size, channels_last=True) * 255
    assert device.shape == (len(cases), 3, out_size, out_size) and device.is_contiguous(memory_format=torch.channels_last)
    # Output pixel x at out_size samples x_S = (x + 0.5) * size / out_size - 0.5 of the size-pixel output.
    ratio = size / out_size
    to_size_pixels = np.array([[ratio, 0, (ratio - 1) / 2], [0, ratio, (ratio - 1) / 2], [0, 0, 1]])
    for image, (canvas, matrix, _) in zip(device, cases):
        to_canvas = np.linalg.inv(matrix) @ to_size_pixels
        expected = cv2.warpAffine(canvas, np.linalg.inv(to_canvas)[:2], (out_size, out_size),
                                  borderValue=(PAD_VALUE,) * 3)
        error = np.abs(image.permute(1, 2, 0).numpy().astype(np.float64) - expected).max(2)
        bound = interpolation_bound(canvas, to_canvas, out_size, device_position_px(batch))
        assert (error <= bound).all(), (error - bound).max()
        assert (error > 0.5).mean() < 0.2  # mostly the rounding alone: a shifted or mis-scaled warp fails this


def test_the_region_holds_every_sample_with_its_neighbours_and_is_smaller_than_the_canvas():
    size = 64
    for canvas, matrix, source in _fixed_sources(size):
        rows, cols = source.region.shape[:2]
        left, top = (source.to_region @ matrix @ (0, 0, 1))[:2]  # canvas (0, 0) in region pixels
        for out_size in (56, 64, 72):  # the sizes multi-scale may fold in
            ratio = size / out_size
            ys, xs = np.mgrid[0:out_size, 0:out_size].astype(np.float64)
            points = np.stack(((xs + 0.5) * ratio - 0.5, (ys + 0.5) * ratio - 0.5, np.ones_like(xs)))
            q = np.einsum("ij,jhw->ihw", source.to_region, points)
            for axis, extent, canvas_extent, origin in ((0, cols, 2 * size, left), (1, rows, 2 * size, top)):
                low, high = np.floor(q[axis]), np.floor(q[axis]) + 1  # the bilinear neighbours
                # Below the region only where the region starts at the fill ring left of the canvas (origin 1),
                # beyond it only where it ends at the ring right of it: there every pixel is fill.
                assert ((low >= 0) | (origin == 1)).all()
                assert ((high <= extent - 1) | (extent - 1 - origin == canvas_extent)).all()
        assert rows * cols <= (canvas.shape[0] + 2) * (canvas.shape[1] + 2)
        # Pixel for pixel the canvas (OpenCV's input, pasted whole) with its one-pixel fill ring, cut to the region.
        ringed = np.pad(canvas, ((1, 1), (1, 1), (0, 0)), constant_values=PAD_VALUE)
        x0, y0 = 1 - round(left), 1 - round(top)  # the region's first pixel in the ringed canvas
        assert np.array_equal(source.region, ringed[y0 : y0 + rows, x0 : x0 + cols])
    zoomed = _fixed_sources(size)[1][2]  # zoom 1.37: the output reads about (2 / 1.37)^2 / 4 of the canvas
    assert zoomed.region.shape[0] * zoomed.region.shape[1] < 0.8 * (2 * size) ** 2


def test_a_region_is_fill_wherever_its_tiles_leave_a_gap_and_tiles_elsewhere():
    """``paste_into`` skips the fill only when the tiles cover the region: written over a buffer of another colour,
    every pixel ends as a tile's or the fill's, also where overlapping tiles add up to the region's area."""
    rng = np.random.default_rng(3)
    a, b = (rng.integers(0, 256, (4, 6, 3), dtype=np.uint8) for _ in range(2))
    cases = {
        "covering": ((a, 0, 0), (b, 0, 4)),  # two 4x6 halves of an 8x6 region: no fill needed
        "gap": ((a[:, :5], 0, 0), (b, 0, 4)),  # column 5 of the top half is uncovered
        "overlap": ((a, 0, 0), (b, 0, 3)),  # 48 pixels of area over 48, but row 7 is uncovered
    }
    for name, tiles in cases.items():
        expected = np.full((8, 6, 3), PAD_VALUE, np.uint8)
        for tile, x, y in tiles:
            expected[y : y + tile.shape[0], x : x + tile.shape[1]] = tile
        source = WarpSource(tiles, (8, 6), np.eye(3), 8)
        out = np.full((8, 6, 3), 7, np.uint8)  # neither a tile's value nor the fill's where it matters
        source.paste_into(out)
        assert np.array_equal(out, expected), name
        assert np.array_equal(source.region, expected), name
    compact = WarpSource(cases["gap"], (8, 6), np.eye(3), 8).compact()
    assert not any(np.shares_memory(tile, source) for tile, _, _ in compact.tiles for source in (a, b))
    assert np.array_equal(compact.region, WarpSource(cases["gap"], (8, 6), np.eye(3), 8).region)
    assert WarpSource(cases["covering"], (8, 6), np.eye(3), 8)._covered()
    assert not any(WarpSource(cases[name], (8, 6), np.eye(3), 8)._covered() for name in ("gap", "overlap"))


def test_shelf_pack_keeps_regions_apart_with_a_gap():
    rng = np.random.default_rng(0)
    shapes = [tuple(int(v) for v in rng.integers(1, 40, 2)) for _ in range(17)]
    positions, height, width = shelf_pack(shapes, gap=1)
    taken = np.zeros((height, width), np.int64)
    for (rows, cols), (x, y) in zip(shapes, positions):
        assert x >= 1 and y >= 1 and x + cols + 1 <= width and y + rows + 1 <= height
        taken[y - 1 : y + rows + 1, x - 1 : x + cols + 1] += 1  # each box with its gap ring
        assert (taken[y : y + rows, x : x + cols] == 1).all()  # no other box (or its ring) inside it
    assert taken.sum() < 2 * sum((r + 2) * (c + 2) for r, c in shapes)


def test_each_region_sits_in_a_ring_of_fill_and_the_render_reads_nothing_else():
    size = 64
    sources = [source for _, _, source in _fixed_sources(size)]
    batch = pack_warp_batch(sources)
    positions, _, _ = shelf_pack([source.region.shape[:2] for source in sources])
    atlas = batch.atlas.numpy()
    for source, (x, y) in zip(sources, positions):
        rows, cols = source.region.shape[:2]
        assert np.array_equal(atlas[y : y + rows, x : x + cols], source.region)
        ring = np.ones((rows + 2, cols + 2), bool)
        ring[1:-1, 1:-1] = False
        assert (atlas[y - 1 : y + rows + 1, x - 1 : x + cols + 1][ring] == PAD_VALUE).all()
    # Whatever lies elsewhere in the atlas (left unwritten) must not reach the output: set it to black, then to
    # white, and render the same images.
    outside = np.ones(atlas.shape[:2], bool)
    for source, (x, y) in zip(sources, positions):
        rows, cols = source.region.shape[:2]
        outside[y - 1 : y + rows + 1, x - 1 : x + cols + 1] = False
    assert outside.any()
    for out_size in (56, 64, 72):
        clean = render(batch, torch.device("cpu"), size=out_size, channels_last=False)
        for value in (0, 255):
            poisoned = batch.atlas.clone()
            poisoned.numpy()[outside] = value
            dirty = render(dataclasses.replace(batch, atlas=poisoned), torch.device("cpu"), size=out_size,
                           channels_last=False)
            assert torch.equal(clean, dirty), (out_size, value)


def _datasets(records, **augment):
    """The same draws three ways: all in the workers, HSV and flips left to the step, and everything left to it."""
    config = AugmentConfig(flipud=0.5, degrees=10.0, shear=3.0, **augment)
    workers = DetectionDataset(records, image_size=64, augment=config, seed=5)
    pixels = DetectionDataset(records, image_size=64, augment=config, seed=5, pixel_ops_on_device=True)
    device = DetectionDataset(records, image_size=64, augment=config, seed=5, geometry_on_device=True)
    return workers, pixels, device


KEYS = [(index, epoch, use_mosaic) for index in range(4) for epoch in range(2) for use_mosaic in (True, False)]


# MixUp's blend, CutMix's paste and a perspective warp are made in the workers, and copied by the warp. CutMix
# pastes only where a rectangle misses the item's boxes and holds a partner's: more epochs, so that some are pasted.
# --bgr: half the items carry the channel swap, applied to both paths' warped pixels before they are compared.
@pytest.mark.parametrize("mix,epochs", [({}, 2), ({"mixup": 1.0}, 2), ({"cutmix": 1.0}, 12),
                                        ({"mixup": 1.0, "cutmix": 1.0}, 12), ({"perspective": 0.001}, 2),
                                        ({"bgr": 0.5, "mixup": 0.5}, 2)], ids=str)
def test_device_items_have_the_worker_items_boxes_and_warped_pixels(tmp_path, mix, epochs):
    keys = [(index, epoch, use_mosaic) for index in range(4) for epoch in range(epochs) for use_mosaic in (True, False)]
    workers, pixels, device = _datasets(write_records(tmp_path, 4, seed=1), albumentations=0.0, **mix)
    _, worker_targets, _ = collate([workers[key] for key in keys])
    # The pixels path's images are OpenCV's warp alone (HSV and flips left to the step): the geometry to compare.
    warped, _, pixel_metas = collate([pixels[key] for key in keys])
    items = [device[key] for key in keys]
    if "cutmix" in mix:  # some items had a rectangle pasted: more boxes than the same item without CutMix
        plain = _datasets(workers.records, albumentations=0.0, **{**mix, "cutmix": 0.0})[0]
        assert any(len(workers[key][1]) > len(plain[key][1]) for key in keys)
    if "perspective" in mix:  # every item tilted: each one warped in the workers, its warp on the device a copy
        assert all(np.array_equal(source.to_region, np.eye(3)) and len(source.tiles) == 1 for source, _, _ in items)
    batch, device_targets, metas = collate(items)
    assert torch.equal(device_targets, worker_targets)  # boxes: the same functions of the same draws
    assert isinstance(batch, WarpBatch) and len(batch) == len(keys)
    assert [meta.pixel_ops for meta in metas] == [meta.pixel_ops for meta in pixel_metas]
    assert len({(meta.pixel_ops.flip_lr, meta.pixel_ops.flip_ud) for meta in metas}) == 4
    out = render(batch, torch.device("cpu"), size=64, channels_last=True) * 255
    swaps = [PixelOps(swap_channels=meta.pixel_ops.swap_channels) for meta in metas]
    assert {op.swap_channels for op in swaps} == ({False, True} if "bgr" in mix else {False})
    # The swap alone (a permutation of the channels, the values untouched), on levels: the error bound below is the
    # largest over a pixel's channels, so it holds as it is for a swapped pair.
    out, warped = apply_pixel_ops(out, swaps), apply_pixel_ops(warped.float(), swaps)
    position = device_position_px(batch)
    for image, expected, (source, _, _) in zip(out, warped, items):
        error = (image - expected.float()).abs().amax(0).numpy()
        bound = interpolation_bound(source.region, source.to_region, 64, position)
        assert (error <= bound).all(), (error - bound).max()


def test_device_path_draws_albumentations_seeds_like_the_worker_path(tmp_path):
    workers, _, device = _datasets(write_records(tmp_path, 4, seed=2), albumentations=0.5)
    for key in KEYS:
        _, worker_labels, _ = workers[key]
        source, device_labels, meta = device[key]
        assert torch.equal(device_labels, worker_labels), key
        assert isinstance(source, WarpSource) and meta.original_hw == (64, 64)
        # No RAM cache here: each tile's part is its own copy, not a view keeping a decoded image whole.
        assert all(tile.flags.owndata for tile, _, _ in source.tiles)


def test_steps_render_the_batch_on_the_device_path(tmp_path):
    _, _, device = _datasets(write_records(tmp_path, 4, seed=3), albumentations=0.0)
    batch = collate([device[(index, 0, True)] for index in range(4)])
    images, targets, metas = as_trained(batch)  # the plot and the AMP check: uint8, warped and flipped on the CPU
    ops = [meta.pixel_ops for meta in batch[2]]
    warped = render_uint8(batch[0])  # what the worker path sends: the warp rounded to uint8
    rendered = render(batch[0], torch.device("cpu"), size=64, channels_last=True)
    assert (warped.float() - rendered * 255).abs().max() <= 0.5 + 255 * 8 * EPS
    expected = (apply_pixel_ops(warped.float() / 255, ops) * 255).round().to(torch.uint8)
    assert torch.equal(images, expected) and images.is_contiguous(memory_format=torch.channels_last)
    assert all(meta.pixel_ops is None for meta in metas) and targets is batch[1]
    # The first images alone (the check reads 8, the plot 16), taken before the warp: the same pixels, their labels.
    two, two_targets, two_metas = as_trained(batch, first=2)
    assert torch.equal(two, images[:2]) and [meta.image_id for meta in two_metas] == [m.image_id for m in metas[:2]]
    assert torch.equal(two_targets, batch[1][batch[1][:, 0] < 2]) and len(two_targets) < len(batch[1])
    assert as_trained(batch, first=8)[0].shape == images.shape  # no more than the batch has
    stepped = step_input(batch[0], 96, torch.device("cpu"), channels_last=True, pixel_ops=ops)
    assert stepped.shape == (4, 3, 96, 96) and stepped.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(stepped, apply_pixel_ops(render(batch[0], torch.device("cpu"), size=96, channels_last=True), ops))
    loader = DataLoader([device[(index, 0, True)] for index in range(4)], batch_size=2, collate_fn=collate)
    torch.manual_seed(0)
    step = make_train_step(build_model(num_classes=3), channels_last=True)
    stats = train_one_epoch(step, loader, multi_scale=MultiScale(64, low=0.5, hold=1), epoch=0, seed=0, progress=False)
    assert stats["optimizer_steps"] == 2 and stats["skipped_steps"] == 0
    assert all(math.isfinite(stats[k]) and stats[k] > 0 for k in ("train/box", "train/cls", "train/dfl"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_render_matches_cpu_and_pins():
    batch = pack_warp_batch([source for _, _, source in _fixed_sources(64)]).pin_memory()
    assert batch.atlas.is_pinned() and batch.theta.is_pinned()
    on_cuda = render(batch, torch.device("cuda"), size=72, channels_last=True)
    on_cpu = render(batch, torch.device("cpu"), size=72, channels_last=True)
    # Both sample the same float32 positions up to their own roundings (device_position_px each way) on
    # pixels up to 255 levels apart, plus the weights' float32 arithmetic.
    tolerance = (2 * device_position_px(batch) * 2 * 255 + 2 * DEVICE_WEIGHTS_LEVELS) / 255
    torch.testing.assert_close(on_cuda.cpu(), on_cpu, rtol=0, atol=tolerance)
