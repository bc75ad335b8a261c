"""Per-image augmentation in OpenCV/NumPy: mosaic, random affine, HSV, flip, albumentations, channel swap.

Images are ``uint8 [H, W, 3]`` RGB; boxes are ``float32 [n, 4]`` xyxy pixels with classes ``[n]`` beside them.
Every geometric step clips boxes to the image and drops those that shrink to slivers.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import cv2
import numpy as np

if TYPE_CHECKING:
    import albumentations as A

# albumentations checks PyPI for a newer version on import (a warning, or a network timeout offline); a trainer
# should be quiet and offline-safe. Set here, with this module, so every loader worker has it whatever its start
# method; a value the user set is left alone.
os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

PAD_VALUE = 114  # grey letterbox / mosaic fill, as YOLO tools use

# A warp's output: the side of a square (every item but --rect's), or a canvas's (height, width) (--rect training,
# one canvas per batch: detector.data.letterbox.rect_batches).
OutSize = int | tuple[int, int]


def output_hw(out_size: OutSize) -> tuple[int, int]:
    """``out_size`` as (height, width): a square's side given once, or the pair itself."""
    if np.ndim(out_size) == 0:
        side = int(out_size)  # type: ignore[arg-type]
        return side, side
    height, width = out_size  # type: ignore[misc]
    return int(height), int(width)


@dataclass(frozen=True)
class AugmentConfig:
    mosaic: float = 1.0  # probability of a 4-image mosaic
    mixup: float = 0.0  # probability of blending with a second augmented image (MixUp), where mosaic is on
    cutmix: float = 0.0  # probability of pasting a rectangle of a second augmented image (CutMix), where mosaic is on
    degrees: float = 0.0  # max rotation (deg)
    translate: float = 0.1  # max shift as a fraction of the output size
    scale: float = 0.5  # zoom drawn from [1 - scale, 1 + scale]
    shear: float = 0.0  # max shear (deg)
    perspective: float = 0.0  # max of each perspective coefficient (per canvas pixel, as Ultralytics' perspective)
    hsv_h: float = 0.015  # hue shift (fraction of a full turn)
    hsv_s: float = 0.7  # saturation gain (fraction)
    hsv_v: float = 0.4  # value gain (fraction)
    fliplr: float = 0.5  # horizontal flip probability
    flipud: float = 0.0  # vertical flip probability
    bgr: float = 0.0  # probability of feeding the image with its channels reversed (RGB as BGR), after all else
    albumentations: float = 0.01  # probability of each albumentations pixel transform


# Ultralytics' ar_thr. It was 20 here (YOLOv3's): every box of a wire, a pole or a line of text longer than 20 times
# its width was dropped from every warped training item, while validation still scored it as ground truth.
MAX_ASPECT = 100


def filter_boxes(
    boxes: np.ndarray, classes: np.ndarray, width: int, height: int, before: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Clip to the image; drop boxes under 2 px a side, or that kept under 10% of their area, or that a warp made
    more than ``MAX_ASPECT`` times as long as wide (Ultralytics' ``box_candidates``)."""
    boxes = boxes.copy()
    boxes[:, [0, 2]] = boxes[:, [0, 2]].clip(0, width)
    boxes[:, [1, 3]] = boxes[:, [1, 3]].clip(0, height)
    box_w, box_h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    keep = (box_w > 2) & (box_h > 2)
    if before is not None:
        area_before = (before[:, 2] - before[:, 0]) * (before[:, 3] - before[:, 1])
        keep &= box_w * box_h > 0.1 * area_before
        aspect = np.maximum(box_w / (box_h + 1e-9), box_h / (box_w + 1e-9))
        keep &= aspect < MAX_ASPECT
    return boxes[keep], classes[keep]


Placement = tuple[int, int, int, int, int, int]  # canvas x1, y1, x2, y2 and the tile's crop corner x, y


def mosaic_placements(shapes: list[tuple[int, int]], size: int, rng: np.random.Generator) -> list[Placement]:
    """Where each of four ``(height, width)`` tiles lands on a ``2*size`` canvas around a random centre (two draws).

    Tile ``i`` fills canvas ``[y1:y2, x1:x2]`` from its crop starting at ``(tile_y1, tile_x1)``; the rest is fill.
    """
    centre_x, centre_y = (int(rng.uniform(0.5 * size, 1.5 * size)) for _ in range(2))
    placements = []
    for index, (height, width) in enumerate(shapes):
        # Corner of the canvas this tile grows from, and the matching crop of the tile.
        if index == 0:  # top left
            x1, y1, x2, y2 = max(centre_x - width, 0), max(centre_y - height, 0), centre_x, centre_y
            tile_x1, tile_y1 = width - (x2 - x1), height - (y2 - y1)
        elif index == 1:  # top right
            x1, y1, x2, y2 = centre_x, max(centre_y - height, 0), min(centre_x + width, 2 * size), centre_y
            tile_x1, tile_y1 = 0, height - (y2 - y1)
        elif index == 2:  # bottom left
            x1, y1, x2, y2 = max(centre_x - width, 0), centre_y, centre_x, min(2 * size, centre_y + height)
            tile_x1, tile_y1 = width - (x2 - x1), 0
        else:  # bottom right
            x1, y1, x2, y2 = centre_x, centre_y, min(centre_x + width, 2 * size), min(2 * size, centre_y + height)
            tile_x1, tile_y1 = 0, 0
        placements.append((x1, y1, x2, y2, tile_x1, tile_y1))
    return placements


def mosaic_tiles(images: list[np.ndarray], placements: list[Placement]) -> list[tuple[np.ndarray, int, int]]:
    """Each tile's visible crop (a view, no copy) and the canvas ``(x, y)`` of its top-left pixel."""
    return [(image[ty : ty + (y2 - y1), tx : tx + (x2 - x1)], x1, y1)
            for image, (x1, y1, x2, y2, tx, ty) in zip(images, placements)]


def paste(tiles: list[tuple[np.ndarray, int, int]], height: int, width: int) -> np.ndarray:
    """A ``height x width`` fill-coloured canvas with each ``(tile, x, y)`` copied in (tiles lie inside it)."""
    canvas = np.full((height, width, 3), PAD_VALUE, np.uint8)
    for tile, x, y in tiles:
        canvas[y : y + tile.shape[0], x : x + tile.shape[1]] = tile
    return canvas


def mosaic_boxes(
    placements: list[Placement], boxes: list[np.ndarray], classes: list[np.ndarray], size: int
) -> tuple[np.ndarray, np.ndarray]:
    """The four tiles' boxes moved with their tiles onto the ``2*size`` canvas, clipped and filtered."""
    out_boxes, out_classes = [], []
    for (x1, y1, _, _, tile_x1, tile_y1), image_boxes, image_classes in zip(placements, boxes, classes):
        shift = np.array([x1 - tile_x1, y1 - tile_y1] * 2, np.float32)
        out_boxes.append(image_boxes + shift)
        out_classes.append(image_classes)
    all_boxes = np.concatenate(out_boxes) if out_boxes else np.zeros((0, 4), np.float32)
    all_classes = np.concatenate(out_classes) if out_classes else np.zeros(0, np.float32)
    # Ours: boxes of 2 px or less a side go here, before the affine; Ultralytics drops only zero-area ones at this
    # stage and tests 2 px after the zoom (up to 1.5x), which could grow a few past it. On coco128 5 of 941 boxes
    # are that small at 320 px (3 at 640), 2 of them within reach of the zoom; BCCD has none.
    return filter_boxes(all_boxes, all_classes, 2 * size, 2 * size)


def mosaic(
    images: list[np.ndarray], boxes: list[np.ndarray], classes: list[np.ndarray], size: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Four images (long side ``size``) around a random centre of a ``2*size`` canvas."""
    placements = mosaic_placements([image.shape[:2] for image in images], size, rng)
    canvas = paste(mosaic_tiles(images, placements), 2 * size, 2 * size)
    all_boxes, all_classes = mosaic_boxes(placements, boxes, classes, size)
    return canvas, all_boxes, all_classes


def affine_matrix(
    height: int, width: int, out_size: OutSize, config: AugmentConfig, rng: np.random.Generator
) -> tuple[np.ndarray, float]:
    """The random affine's float64 ``[3, 3]`` matrix (image pixels -> output pixels: the ``out_size`` square, or a
    ``(height, width)`` canvas) and its zoom.

    Rotate/scale/shear/translate around the image centre; six draws, in that order. The zoom is relative to the
    output's long side (a --rect canvas's is --imgsz, as the square's: objects keep the scale they have in a square),
    the translation to each side's own length, as Ultralytics' RandomPerspective takes a rect batch's shape. With
    ``config.perspective`` above 0, two more after them: the perspective coefficients ``U(-p, p)`` of x and y,
    applied first to the centred canvas (Ultralytics' ``M = T @ S @ R @ P @ C``), so the matrix's bottom row is no
    longer ``[0, 0, 1]``. At 0 nothing more is drawn and the matrix is what it was, bit for bit.
    """
    out_height, out_width = output_hw(out_size)
    long_side = max(out_height, out_width)
    to_origin = np.array([[1, 0, -width / 2], [0, 1, -height / 2], [0, 0, 1]], np.float64)
    angle = rng.uniform(-config.degrees, config.degrees)
    # A mosaic canvas is twice the output size; fold that into the zoom so objects keep their scale.
    zoom = rng.uniform(1 - config.scale, 1 + config.scale) * long_side / max(height, width) * (
        2 if height >= 2 * long_side else 1
    )
    rotate = np.eye(3)
    rotate[:2] = cv2.getRotationMatrix2D((0, 0), angle, zoom)
    shear = np.eye(3)
    shear[0, 1] = math.tan(math.radians(rng.uniform(-config.shear, config.shear)))
    shear[1, 0] = math.tan(math.radians(rng.uniform(-config.shear, config.shear)))
    to_output = np.eye(3)
    to_output[0, 2] = rng.uniform(0.5 - config.translate, 0.5 + config.translate) * out_width
    to_output[1, 2] = rng.uniform(0.5 - config.translate, 0.5 + config.translate) * out_height
    if config.perspective <= 0:
        return to_output @ shear @ rotate @ to_origin, zoom
    # In canvas pixels, as Ultralytics applies it: the canvas is its size too (long side --imgsz, mosaic twice).
    tilt = np.eye(3)
    tilt[2, 0] = rng.uniform(-config.perspective, config.perspective)
    tilt[2, 1] = rng.uniform(-config.perspective, config.perspective)
    return to_output @ shear @ rotate @ tilt @ to_origin, zoom


def is_affine(matrix: np.ndarray) -> bool:
    """True when ``matrix``'s bottom row is ``[0, 0, 1]`` (no perspective term): exactly so, as drawn at 0."""
    return bool(matrix[2, 0] == 0 and matrix[2, 1] == 0 and matrix[2, 2] == 1)


def warp_image(image: np.ndarray, matrix: np.ndarray, out_size: OutSize) -> np.ndarray:
    """OpenCV's bilinear warp of ``image`` by ``matrix`` into an ``out_size`` square (or ``(height, width)`` canvas),
    fill outside: ``warpAffine``, or ``warpPerspective`` where the matrix has a perspective term (as Ultralytics
    chooses)."""
    out_height, out_width = output_hw(out_size)
    if is_affine(matrix):
        return cv2.warpAffine(image, matrix[:2], (out_width, out_height), borderValue=(PAD_VALUE,) * 3)
    return cv2.warpPerspective(image, matrix, (out_width, out_height), borderValue=(PAD_VALUE,) * 3)


# |w| below which a point counts as on the horizon, the line a perspective matrix sends to infinity. Not a tuned
# value: any positive one far below 1 does. A point on an edge at w = HORIZON_W projects to its affine coordinates
# times 1e9, outside any output square (unless those lie within 1e-6 px of its origin), so its part of the box
# reaches the output's edge in that direction, as the image of an edge running to infinity does, once clipped.
HORIZON_W = 1e-9
# The corners as warp_boxes orders them, (x1 y1), (x2 y2), (x1 y2), (x2 y1), taken round the box: the edges.
EDGES = ((0, 3), (3, 1), (1, 2), (2, 0))


def warp_boxes(
    boxes: np.ndarray, classes: np.ndarray, matrix: np.ndarray, zoom: float, out_size: OutSize
) -> tuple[np.ndarray, np.ndarray]:
    """Boxes moved by ``matrix`` (the enclosing box of their four corners), clipped to the output (a square or a
    ``(height, width)`` canvas) and filtered."""
    if len(boxes) == 0:
        return boxes, classes
    out_height, out_width = output_hw(out_size)
    scaled_before = boxes * np.float32(zoom)
    return filter_boxes(warped_extent(boxes, matrix, out_size), classes, out_width, out_height, before=scaled_before)


def warped_extent(boxes: np.ndarray, matrix: np.ndarray, out_size: OutSize) -> np.ndarray:
    """float32 ``[n, 4]``: the enclosing box of each xyxy box's corners mapped by ``matrix`` and divided by their
    homogeneous coordinate w (Ultralytics' ``apply_bboxes``; w is exactly 1 for an affine matrix, so the division
    changes nothing there). Not clipped to the ``out_size`` output, except where a box meets the horizon:

    a box that a perspective matrix cuts with its horizon (w of both signs among its corners: at --imgsz 640 and
    --perspective 0.001, w at a mosaic canvas's corner goes down to 1 - 0.001 * (640 + 640) = -0.28) is not bounded
    by its corners: its image runs out to infinity on both sides. Ultralytics' box of the divided corners can then
    span the output the wrong way (a box in one corner of it could come out as the whole image); here each side's
    part is bounded on its own and clipped to the output, and the box encloses those that reach it
    (:func:`_split_extent`). It never misses the object, but may be loose: a part running out to infinity is clipped
    as a box, not as a polygon (a review found 106 of 142 such boxes over 4 px too large at --perspective 0.002 and
    640 px, the geometry of 1280 px at 0.001; at 640 px and 0.001 one box in its sample met the horizon)."""
    corners = boxes[:, [0, 1, 2, 3, 0, 3, 2, 1]].reshape(-1, 2)  # 4 corners per box
    mapped = (np.concatenate((corners, np.ones((len(corners), 1))), 1) @ matrix.T).reshape(-1, 4, 3)
    with np.errstate(divide="ignore", invalid="ignore"):  # w = 0 only on a cut box, replaced below
        points = mapped[..., :2] / mapped[..., 2:]
    extent = np.concatenate((points.min(1), points.max(1)), 1)
    w = mapped[..., 2]
    cut = ~((w >= HORIZON_W).all(1) | (w <= -HORIZON_W).all(1))
    if cut.any():
        extent[cut] = _split_extent(mapped[cut], out_size)
    return extent.astype(np.float32)


def _split_extent(mapped: np.ndarray, out_size: OutSize) -> np.ndarray:
    """``[n, 4]`` boxes of quadrilaterals whose homogeneous corners ``mapped`` (``[n, 4, 3]``) lie on both sides of
    the horizon. Each side's part is the polygon of its own corners and the points where its edges cross
    ``|w| = HORIZON_W``, which project to finite points; its enclosing box, clipped to the ``out_size`` output, is
    kept where it is not empty, and the result encloses the kept ones. None kept: an empty box, which the filter
    drops."""
    out_height, out_width = output_hw(out_size)
    upper = np.array([out_width, out_height] * 2)  # x1 y1 x2 y2: a square's side four times, as it was
    parts: list[np.ndarray] = []
    with np.errstate(divide="ignore", invalid="ignore"):  # the corners of the other side divide too, then dropped
        for side in (1.0, -1.0):  # the part with w > 0, then the part with w < 0 (which OpenCV draws too)
            homogeneous = mapped * side
            w = homogeneous[..., 2]
            found = [np.where((w >= HORIZON_W)[..., None], homogeneous[..., :2] / w[..., None], np.nan)]
            for start, end in EDGES:
                w0, w1 = w[:, start], w[:, end]
                crosses = (w0 - HORIZON_W) * (w1 - HORIZON_W) < 0
                t = np.where(crosses, (HORIZON_W - w0) / np.where(crosses, w1 - w0, 1.0), 0.0)
                start_xy, end_xy = homogeneous[:, start, :2], homogeneous[:, end, :2]
                point = (start_xy + t[:, None] * (end_xy - start_xy)) / HORIZON_W  # on the edge, at w = HORIZON_W
                found.append(np.where(crosses[:, None], point, np.nan)[:, None])
            points = np.concatenate(found, 1)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows: no part on this side
                part = np.concatenate((np.nanmin(points, 1), np.nanmax(points, 1)), 1).clip(0, upper)
            empty = ~((part[:, 2] > part[:, 0]) & (part[:, 3] > part[:, 1]))  # NaN compares False: empty too
            part[empty] = (np.inf, np.inf, -np.inf, -np.inf)  # the identity of the union below
            parts.append(part)
    first, second = parts
    union = np.concatenate((np.minimum(first[:, :2], second[:, :2]), np.maximum(first[:, 2:], second[:, 2:])), 1)
    return np.where(np.isfinite(union), union, 0.0)


def random_affine(
    image: np.ndarray,
    boxes: np.ndarray,
    classes: np.ndarray,
    out_size: OutSize,
    config: AugmentConfig,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rotate/scale/shear/translate (and tilt, with ``config.perspective``) around the image centre into an
    ``out_size`` square (or ``(height, width)`` canvas), in one warp."""
    matrix, zoom = affine_matrix(image.shape[0], image.shape[1], out_size, config, rng)
    new_boxes, new_classes = warp_boxes(boxes, classes, matrix, zoom, out_size)
    return warp_image(image, matrix, out_size), new_boxes, new_classes


HSV_UNCHANGED = (0.0, 1.0, 1.0)  # (hue shift, saturation gain, value gain) that leave an image as it is


def draw_hsv(config: AugmentConfig, rng: np.random.Generator) -> tuple[float, float, float]:
    """A hue shift in turns, ``U(-1, 1) * hsv_h``, then saturation and value gains, ``1 + U(-1, 1) * fraction``.

    The hue is shifted, as Ultralytics does since 8.3.79; YOLOv5's multiplied it (what this did before), which left
    reds, whose hue is near 0, unchanged and moved hues near a full turn the most."""
    hue, sat, val = rng.uniform(-1, 1, 3) * [config.hsv_h, config.hsv_s, config.hsv_v] + HSV_UNCHANGED
    return float(hue), float(sat), float(val)


def augment_hsv(image: np.ndarray, hsv: tuple[float, float, float]) -> np.ndarray:
    """Shift the hue and scale saturation and value (:func:`draw_hsv`'s ``hsv``) through lookup tables on OpenCV's
    uint8 HSV (hue in 2-degree units: 180 a turn). Unchanged ``hsv`` returns ``image`` itself: the uint8 round trip
    alone moves colours by a level or two."""
    if tuple(hsv) == HSV_UNCHANGED:
        return image
    hue, sat, val = cv2.split(cv2.cvtColor(image, cv2.COLOR_RGB2HSV))
    table = np.arange(256, dtype=np.float64)  # float64 arithmetic, whatever type the parameters come in
    lut_hue = ((table + hsv[0] * 180) % 180).astype(np.uint8)
    lut_sat = np.clip(table * hsv[1], 0, 255).astype(np.uint8)
    lut_val = np.clip(table * hsv[2], 0, 255).astype(np.uint8)
    merged = cv2.merge((cv2.LUT(hue, lut_hue), cv2.LUT(sat, lut_sat), cv2.LUT(val, lut_val)))
    return cv2.cvtColor(merged, cv2.COLOR_HSV2RGB)


def draw_flips(config: AugmentConfig, rng: np.random.Generator) -> tuple[bool, bool]:
    """Whether to flip left-right and top-bottom (two draws, always both)."""
    flip_lr = bool(rng.random() < config.fliplr)
    flip_ud = bool(rng.random() < config.flipud)
    return flip_lr, flip_ud


def draw_channel_swap(config: AugmentConfig, rng: np.random.Generator) -> bool:
    """Whether to reverse the image's channel order (Ultralytics' ``bgr``): one draw, and none at all when
    ``config.bgr`` is 0, so that a run without it draws, and so augments, exactly what it did before it existed.
    Drawn after every other draw of the item, for the same reason."""
    return config.bgr > 0 and bool(rng.random() < config.bgr)


def swap_channels(image: np.ndarray, swap: bool) -> np.ndarray:
    """``image`` (``[H, W, 3]``) with its channels reversed when ``swap``, else itself. Ultralytics' ``bgr`` feeds the
    image in the order it was not decoded to: the model sees some images in BGR, and learns to take either."""
    return np.ascontiguousarray(image[:, :, ::-1]) if swap else image


def flip_boxes(boxes: np.ndarray, width: int, height: int, *, flip_lr: bool, flip_ud: bool) -> np.ndarray:
    """xyxy pixel boxes of a ``width x height`` image, mirrored as :func:`flip_image` mirrors the pixels."""
    if flip_lr:
        boxes = boxes.copy()
        boxes[:, [0, 2]] = width - boxes[:, [2, 0]]
    if flip_ud:
        boxes = boxes.copy()
        boxes[:, [1, 3]] = height - boxes[:, [3, 1]]
    return boxes


def flip_image(image: np.ndarray, *, flip_lr: bool, flip_ud: bool) -> np.ndarray:
    if flip_lr:
        image = np.ascontiguousarray(image[:, ::-1])
    if flip_ud:
        image = np.ascontiguousarray(image[::-1])
    return image


class PixelTransforms:
    """albumentations' blur, median blur, gray and CLAHE, each applied with ``probability`` (pixel-level only, so
    boxes stay valid by construction).

    Whether each fires is drawn from the item's own generator, and only a transform that fires is called (seeded
    from that generator too, so an item stays a pure function of its seed). ``A.Compose`` of the same transforms
    with ``p=probability`` decides the same way, independently per transform and in this order, but reseeding its
    five generators and passing the image through cost ~0.4 ms per item (2-core AMD EPYC), for transforms that,
    at the default 1%, fire on ~4% of items.
    """

    def __init__(self, probability: float) -> None:
        # Imported here, not with this module: predict, val and export read PAD_VALUE and the letterbox from this
        # package, and albumentations (with SciPy) took ~0.6 s of their start on a 2-core EPYC. Not later either,
        # in each loader worker at its first transform: that saved training's start ~0.3 s but cost every worker
        # ~60 MB of private memory, which workers forked after this import share (docs/training.md).
        import albumentations as A

        self.probability = probability
        self.transforms: list[A.ImageOnlyTransform] = [A.Blur(p=1.0), A.MedianBlur(p=1.0), A.ToGray(p=1.0),
                                                       A.CLAHE(p=1.0)]

    def draw(self, rng: np.random.Generator) -> list[tuple[A.ImageOnlyTransform, int]]:
        """The transforms that fire on this item, with their seeds (usually none)."""
        fires = rng.random(len(self.transforms)) < self.probability
        seed = int(rng.integers(2**31))  # drawn whether or not one fires: the draws after it stay where they were
        return [(transform, seed + offset) for offset, (transform, fire) in enumerate(zip(self.transforms, fires))
                if fire]

    @staticmethod
    def apply(image: np.ndarray, drawn: list[tuple[A.ImageOnlyTransform, int]]) -> np.ndarray:
        """``image`` through the ``drawn`` transforms, in order."""
        for transform, seed in drawn:
            transform.set_random_seed(seed)
            image = transform(image=image)["image"]
        return image


def build_albumentations(probability: float) -> PixelTransforms | None:
    """The albumentations step of training items, or None when its probability is 0."""
    return PixelTransforms(probability) if probability > 0 else None
