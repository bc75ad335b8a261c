"""Mosaic and random affine on the training device: the workers send source pixels and matrices, the step warps.

``--pixel-augment device``. A loader worker draws everything as the OpenCV path does (tile placement, the
affine matrix, HSV shift and gains, flips; :mod:`detector.data.augment`), moves the boxes on the host with the same
matrices, and keeps only the part of the mosaic canvas that the warp reads: a :class:`WarpSource`, the
uint8 pixels the ``out_size`` square samples (fill colour where no tile lies) and the matrix from output
pixels to that region, kept as views of the tiles in it. Collate pastes each region's tiles straight into one
uint8 atlas (:class:`WarpBatch`, pinned by the loader on CUDA) and folds placement, affine, atlas position and
the multi-scale size into one 2x3 matrix per image; the step then samples every output image of the batch in
one ``affine_grid`` + ``grid_sample`` (bilinear, as ``cv2.warpAffine``), after which HSV and flips run as on the
``pixels`` path (:mod:`detector.data.batch_augment`).

Reading only the sampled region keeps the bytes sent per image near the output's: the zoom is drawn from
``[0.5, 1.5]``, so the region averages ~1.3x the output's pixels (at most the 2x-size canvas, 4x).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from detector.data.augment import PAD_VALUE
from detector.data.pinned import pinned_copy
from detector.data.workers import Release, pooled_batch_tensor, release

GAP = 1  # fill-coloured pixels around every region in the atlas: what a clamped sample's zero-weight neighbour reads


Tile = tuple[np.ndarray, int, int]  # pixels uint8 [h, w, 3] and the (x, y) of their top-left pixel


@dataclass(frozen=True)
class WarpSource:
    """One training image before its warp: the uint8 RGB ``region`` of the canvas that the warp reads, as
    ``tiles`` (views of the source images, placed in region pixels, not overlapping; fill colour elsewhere) of
    ``shape`` (rows, cols), and ``to_region`` (float64 ``[3, 3]``) from ``out_size`` output pixels to region
    pixels.

    Every sample the warp takes lies in the region with its bilinear neighbours, or outside the canvas, where
    the fill colour is; the region's border rows/columns that lie outside the canvas are fill, so clamping a
    sample to the region gives the same value as OpenCV's constant border. The region is kept as tiles so that
    collate pastes them straight into the batch's atlas (:meth:`paste_into`): one copy of the pixels, where a
    region of its own cost a fill and a second copy of ~1.6 MB per 640-px image in every loader worker.
    """

    tiles: tuple[Tile, ...]
    shape: tuple[int, int]
    to_region: np.ndarray
    out_size: int

    @classmethod
    def of_pixels(cls, region: np.ndarray, to_region: np.ndarray, out_size: int) -> "WarpSource":
        """A source whose region is ``region`` itself (after albumentations changed its pixels)."""
        return cls(((region, 0, 0),), region.shape[:2], to_region, out_size)

    def compact(self) -> "WarpSource":
        """The same source with each tile's part copied out of its image: an item then holds only what the warp
        reads. For decoded images (no RAM cache), which views would keep whole, four per mosaic item, until collate:
        ~300 MB a 640-px batch of 64 in every worker, against ~100 MB."""
        return WarpSource(tuple((tile.copy(), x, y) for tile, x, y in self.tiles), self.shape, self.to_region,
                          self.out_size)

    @property
    def region(self) -> np.ndarray:
        """The region as one array (a copy; collate never makes it)."""
        region = np.empty((*self.shape, 3), np.uint8)
        self.paste_into(region)
        return region

    def paste_into(self, out: np.ndarray) -> None:
        """Write the region into ``out`` (uint8 ``[rows, cols, 3]``): the fill colour where no tile lies, then the
        tiles (the fill is skipped where they cover all of it: most mosaics, at moderate zoom)."""
        if not self._covered():
            out[...] = PAD_VALUE
        for tile, x, y in self.tiles:
            out[y : y + tile.shape[0], x : x + tile.shape[1]] = tile

    def _covered(self) -> bool:
        """True when the tiles cover every region pixel: their areas add up to the region's and no two overlap
        (checked, so a caller's overlapping tiles cost a fill instead of leaving pixels unwritten)."""
        rects = [(x, y, x + tile.shape[1], y + tile.shape[0]) for tile, x, y in self.tiles]
        if sum((r[2] - r[0]) * (r[3] - r[1]) for r in rects) != self.shape[0] * self.shape[1]:
            return False
        return not any(a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]
                       for i, a in enumerate(rects) for b in rects[i + 1:])


def canvas_region(tiles: Sequence[Tile], height: int, width: int, matrix: np.ndarray, out_size: int) -> WarpSource:
    """The part of a ``height x width`` canvas (``(tile, x, y)`` pasted on fill) that ``matrix`` warps into
    the ``out_size`` square, one pixel of margin beyond the bilinear neighbours, cut to the canvas plus a
    one-pixel fill ring: each tile's part inside it, as views (nothing is copied here)."""
    inverse = np.linalg.inv(matrix)  # output pixels -> canvas pixels
    edge = out_size - 0.5  # output samples lie in [-0.5, out_size - 0.5] at any multi-scale size
    corners = inverse @ np.array([[-0.5, edge, -0.5, edge], [-0.5, -0.5, edge, edge], [1, 1, 1, 1]])
    low, high = np.floor(corners[:2].min(1)) - 1, np.floor(corners[:2].max(1)) + 2
    x0, x1 = (int(np.clip(v, -1, width)) for v in (low[0], high[0]))  # inclusive, in canvas pixels
    y0, y1 = (int(np.clip(v, -1, height)) for v in (low[1], high[1]))
    parts = []
    for tile, x, y in tiles:
        left, right = max(x, x0), min(x + tile.shape[1], x1 + 1)
        top, bottom = max(y, y0), min(y + tile.shape[0], y1 + 1)
        if left < right and top < bottom:
            parts.append((tile[top - y : bottom - y, left - x : right - x], left - x0, top - y0))
    to_region = np.array([[1, 0, -x0], [0, 1, -y0], [0, 0, 1]], np.float64) @ inverse
    return WarpSource(tuple(parts), (y1 - y0 + 1, x1 - x0 + 1), to_region, out_size)


def shelf_pack(shapes: Sequence[tuple[int, int]], gap: int = GAP) -> tuple[list[tuple[int, int]], int, int]:
    """``(x, y)`` of each ``(height, width)`` box in one atlas, and its height and width.

    Next-fit by decreasing height on shelves as wide as the widest box, ``gap`` pixels around each.
    """
    width = max(w for _, w in shapes) + 2 * gap
    positions: list[tuple[int, int]] = [(0, 0)] * len(shapes)
    x, y, shelf = gap, gap, 0
    for index in sorted(range(len(shapes)), key=lambda i: -shapes[i][0]):
        height_i, width_i = shapes[index]
        if x + width_i + gap > width:
            x, y, shelf = gap, y + shelf + gap, 0
        positions[index] = (x, y)
        x, shelf = x + width_i + gap, max(shelf, height_i)
    return positions, y + shelf + gap, width


@dataclass(frozen=True)
class WarpBatch:
    """A collated batch on the device path: what :func:`render` turns into ``[B, 3, size, size]`` images.

    ``atlas``: uint8 ``[H, W, 3]``, every image's region; ``theta``: float32 ``[B, 2, 3]``, ``affine_grid``
    matrices from normalised output coordinates to normalised atlas coordinates (independent of the output
    size); ``bounds``: float32 ``[B, 4]``, each region's first and last pixel centre in normalised atlas
    coordinates (x, y, x, y); ``out_size``: the size the worker path would have produced; ``ticket``: where
    the atlas is a loader worker's pooled buffer (:class:`detector.data.workers.BatchPool`), what frees it once
    copied out (:meth:`pin_memory` does; nothing else may, since the worker writes the next batch into it).
    """

    atlas: torch.Tensor
    theta: torch.Tensor
    bounds: torch.Tensor
    out_size: int
    ticket: Release | None = None

    def __len__(self) -> int:
        return len(self.theta)

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(atlas, theta, bounds)``."""
        return self.atlas, self.theta, self.bounds

    def pin_memory(self) -> "WarpBatch":
        """Page-locked copies (the DataLoader's pin thread calls this on CUDA), so the copy to the GPU overlaps.
        The copies are made (synchronously) before the worker's buffer is freed: the batch returned is the only
        one to use after this. The atlas, nearly all of the bytes, is copied on several threads
        (:func:`detector.data.pinned.pinned_copy`): the pin thread alone copies at one core's rate."""
        pinned = WarpBatch(pinned_copy(self.atlas), self.theta.pin_memory(), self.bounds.pin_memory(), self.out_size)
        release(self.ticket, self.atlas)
        object.__setattr__(self, "ticket", None)  # freed once: a second call must not free the slot's next batch
        return pinned

    def to(self, device: torch.device, *, non_blocking: bool = False) -> "WarpBatch":
        """The batch on ``device`` (as ``Tensor.to``: the tensors themselves where they are there already)."""
        return WarpBatch(*(tensor.to(device, non_blocking=non_blocking) for tensor in self.tensors()), self.out_size)


def pack_warp_batch(sources: Sequence[WarpSource]) -> WarpBatch:
    """Collate: the regions into one atlas, each image's matrix folded into one ``affine_grid`` matrix."""
    out_size = sources[0].out_size
    positions, height, width = shelf_pack([source.shape for source in sources])
    # Only each region and its one-pixel ring are ever read (the samples are clamped to the region, and a bilinear
    # sample's other neighbour is at most one pixel out): the ring is filled, the rest of the atlas left as it is.
    # Filling all of it was a pass over ~1.3x the batch's bytes (135 MB at 640 px, batch 64, mosaic).
    assert GAP >= 1, "the ring written below is one pixel wide, in the gap shelf_pack leaves"
    atlas, ticket = pooled_batch_tensor((height, width, 3))
    pixels = atlas.numpy()
    # align_corners=False: pixel centre a <-> normalised (2a + 1) / W - 1, both for the atlas and the output.
    to_normalised = np.array([[2 / width, 0, 1 / width - 1], [0, 2 / height, 1 / height - 1], [0, 0, 1]])
    from_normalised = np.array([[out_size / 2, 0, (out_size - 1) / 2], [0, out_size / 2, (out_size - 1) / 2],
                                [0, 0, 1]])  # normalised output -> output pixels, whatever grid size samples it
    thetas, bounds = [], []
    for source, (x, y) in zip(sources, positions):
        rows, cols = source.shape
        source.paste_into(pixels[y : y + rows, x : x + cols])
        pixels[[y - 1, y + rows], x - 1 : x + cols + 1] = PAD_VALUE  # the ring: rows above and below,
        pixels[y - 1 : y + rows + 1, [x - 1, x + cols]] = PAD_VALUE  # columns left and right
        to_atlas = np.array([[1, 0, x], [0, 1, y], [0, 0, 1]], np.float64) @ source.to_region
        thetas.append((to_normalised @ to_atlas @ from_normalised)[:2])
        first, last = to_normalised @ (x, y, 1), to_normalised @ (x + cols - 1, y + rows - 1, 1)
        bounds.append((first[0], first[1], last[0], last[1]))
    return WarpBatch(atlas, torch.tensor(np.array(thetas), dtype=torch.float32),
                     torch.tensor(bounds, dtype=torch.float32), out_size, ticket)


def render(batch: WarpBatch, device: torch.device, *, size: int, channels_last: bool) -> torch.Tensor:
    """Every image of ``batch`` warped at once: float ``[B, 3, size, size]`` RGB in [0, 1] on ``device``.

    ``size`` other than ``batch.out_size`` folds the multi-scale resize into the same sampling (bilinear,
    pixel centres as ``F.interpolate(align_corners=False)``). Samples are clamped to their image's region.
    """
    count = len(batch)
    atlas, theta, bounds = batch.to(device, non_blocking=True).tensors()
    bounds = bounds[:, None, None]
    grid = F.affine_grid(theta, [count, 3, size, size], align_corners=False)
    grid = grid.clamp_(bounds[..., :2], bounds[..., 2:])  # in place: one pass
    # One sampling call over the atlas as a single image: the B output grids stacked into one tall grid.
    source = atlas.permute(2, 0, 1)[None].float()
    out = F.grid_sample(source, grid.reshape(1, count * size, size, 2), mode="bilinear", padding_mode="zeros",
                        align_corners=False)
    layout = torch.channels_last if channels_last else torch.contiguous_format
    return out.view(3, count, size, size).transpose(0, 1).contiguous(memory_format=layout).div_(255)


def render_uint8(batch: WarpBatch) -> torch.Tensor:
    """The batch as the worker path would have sent it: uint8 ``[B, 3, S, S]`` (channels-last) on the CPU."""
    images = render(batch, torch.device("cpu"), size=batch.out_size, channels_last=True)
    return images.mul_(255).round_().to(torch.uint8)

