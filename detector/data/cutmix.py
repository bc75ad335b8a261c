"""CutMix: a rectangle of a second augmented image pasted into an item, with the boxes of it the rectangle holds.

What Ultralytics 8.4 does (``ultralytics/data/augment.py``, ``CutMix``, after mosaic + random affine and MixUp in
``v8_transforms``; set to 0 in close-mosaic epochs, as mosaic and MixUp are): with probability ``cutmix`` it draws
three candidate rectangles, each ``int(side * sqrt(1 - lam))`` a side with ``lam ~ Beta(1, 1)``, around a centre
drawn uniformly among the pixels, reaching half that side (rounded down) each way and clipped to the image. It keeps
the candidates that overlap none of the item's boxes (intersection over the box's area 0), and leaves the item alone
when none does; else it picks one of them at random. A second image, through its own mosaic and affine, gives its
boxes whose intersection with the rectangle is at least 0.1 of their area, clipped to the rectangle (none: the item
is left alone); that rectangle of its pixels replaces the item's, and its boxes are appended.

Here the same, with these differences, none of which changes what is drawn from what distribution:

- the draws come from the item's seeded generator (the partner's mosaic and affine from a stream of its own,
  :meth:`~detector.data.dataset.DetectionDataset._train_item`), not from the global ``random``/``np.random``;
- the rectangles are drawn before the partner is made, and the partner is made only when one of them is free:
  Ultralytics builds the partner's mosaic first and throws it away when none is; nothing it draws moves the rectangles.

Pasted boxes are clipped and kept as Ultralytics keeps them: not filtered again for size (a kept box holds at least a
tenth of its area, but may be a sliver along the rectangle's edge).
"""

from __future__ import annotations

import numpy as np

CANDIDATES = 3  # rectangles drawn per item (Ultralytics' num_areas)
BETA = 1.0  # lam ~ Beta(BETA, BETA): Beta(1, 1) is uniform on [0, 1]
MIN_PARTNER_IOA = 0.1  # a partner box comes along when the rectangle holds this share of its area


def draw_rectangles(rng: np.random.Generator, height: int, width: int, count: int = CANDIDATES) -> np.ndarray:
    """``count`` candidate rectangles ``int [count, 4]`` (x1, y1, x2, y2 pixels, clipped to the image): per rectangle
    ``lam``, then the centre's x and y, three draws in that order."""
    rectangles = np.empty((count, 4), np.int64)
    for row in range(count):
        cut = np.sqrt(1.0 - rng.beta(BETA, BETA))
        half_w, half_h = int(width * cut) // 2, int(height * cut) // 2
        centre_x, centre_y = int(rng.integers(width)), int(rng.integers(height))
        rectangles[row] = (centre_x - half_w, centre_y - half_h, centre_x + half_w, centre_y + half_h)
    rectangles[:, 0::2] = rectangles[:, 0::2].clip(0, width)
    rectangles[:, 1::2] = rectangles[:, 1::2].clip(0, height)
    return rectangles


def intersections(rectangles: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """``[R, N]`` areas each rectangle shares with each xyxy box (float64: exact for these pixel sizes)."""
    rectangles, boxes = rectangles.astype(np.float64), boxes.astype(np.float64)
    low = np.maximum(rectangles[:, None, :2], boxes[None, :, :2])
    high = np.minimum(rectangles[:, None, 2:], boxes[None, :, 2:])
    return (high - low).clip(0).prod(2)


def choose_rectangle(rng: np.random.Generator, rectangles: np.ndarray, boxes: np.ndarray) -> np.ndarray | None:
    """One of the rectangles that overlaps none of ``boxes``, drawn uniformly (one draw), or None when all do.

    An overlap is a positive intersection: Ultralytics' test, the intersection over the box's area summed over
    the boxes being 0, holds exactly when every intersection is 0."""
    free = np.flatnonzero((intersections(rectangles, boxes) <= 0).all(1))
    if len(free) == 0:
        return None
    return rectangles[free[int(rng.integers(len(free)))]]


def boxes_inside(rectangle: np.ndarray, boxes: np.ndarray, classes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The boxes whose intersection with ``rectangle`` is at least ``MIN_PARTNER_IOA`` of their area, clipped to it,
    and their classes."""
    area = ((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])).astype(np.float64)
    shared = intersections(rectangle[None], boxes)[0]
    # A box of no area shares none: it is never kept (Ultralytics' eps in the denominator gives the same).
    keep = (area > 0) & (shared >= MIN_PARTNER_IOA * area)
    kept = boxes[keep].copy()
    kept[:, 0::2] = kept[:, 0::2].clip(rectangle[0], rectangle[2])
    kept[:, 1::2] = kept[:, 1::2].clip(rectangle[1], rectangle[3])
    return kept, classes[keep]


def paste_rectangle(image: np.ndarray, partner: np.ndarray, rectangle: np.ndarray) -> np.ndarray:
    """``image`` with ``rectangle``'s pixels replaced by ``partner``'s (in place: callers pass their own copy)."""
    x1, y1, x2, y2 = (int(v) for v in rectangle)
    image[y1:y2, x1:x2] = partner[y1:y2, x1:x2]
    return image
