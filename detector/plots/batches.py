"""Image grids with boxes drawn by OpenCV: training batches and validation predictions beside ground truth.

OpenCV draws a 16-image 640-px grid in tens of milliseconds, where matplotlib would take seconds; and this module
imports no matplotlib, so a training process whose figures are drawn by its helper (detector/plots/worker.py) never
imports it.
"""

from __future__ import annotations

import colorsys
import math
from pathlib import Path

import cv2
import numpy as np
import torch

from detector.files import write_image

MAX_GRID_SIDE = 1920  # pixels; tiles shrink so the whole grid stays under this
DRAW_CONF = 0.25  # predictions below this score are not drawn
GT_COLOR = (40, 200, 40)  # RGB, ground-truth boxes in the prediction plots
PLOTTED_IMAGES = 16  # a batch plot's images at most (train_batch0.png)
TILE_GAP = 6  # pixels of white between grid cells
PAIR_GAP = 2  # pixels of white between the ground-truth and prediction halves of one cell


def class_color(index: int) -> tuple[int, int, int]:
    """A stable, well-separated colour for class ``index`` as 0-255 RGB (golden-ratio hue steps)."""
    hue = (index * 0.618033988749895) % 1.0
    red, green, blue = colorsys.hsv_to_rgb(hue, 0.85, 0.95)
    return int(red * 255), int(green * 255), int(blue * 255)


def normalised_to_xyxy(boxes_cxcywh: torch.Tensor | np.ndarray, width: float, height: float) -> np.ndarray:
    """``[n, 4]`` normalised (cx, cy, w, h) -> ``[n, 4]`` xyxy pixels of a ``width x height`` image."""
    boxes = np.asarray(boxes_cxcywh, dtype=np.float64).reshape(-1, 4)
    half = boxes[:, 2:] / 2
    scale = np.array([width, height, width, height])
    return np.concatenate((boxes[:, :2] - half, boxes[:, :2] + half), 1) * scale


def _to_rgb_tiles(images: torch.Tensor, count: int) -> list[np.ndarray]:
    """``uint8 [B, 3, S, S]`` (or float in [0, 1]) -> ``count`` contiguous ``uint8 [S, S, 3]`` arrays."""
    images = images[:count].detach().cpu()
    if images.is_floating_point():
        images = (images.clamp(0, 1) * 255).round().to(torch.uint8)
    return [np.ascontiguousarray(image.permute(1, 2, 0).numpy()) for image in images]


def _draw_boxes(
    tile: np.ndarray,
    boxes_xyxy: np.ndarray,
    labels: np.ndarray,
    names: list[str],
    *,
    scores: np.ndarray | None = None,
    color: tuple[int, int, int] | None = None,
) -> None:
    """Draw boxes (pixels of ``tile``) in place with ``name`` or ``name 0.87`` captions; one colour per class
    unless ``color`` is given."""
    side = max(tile.shape[:2])
    thickness = max(1, round(side / 320))
    font_scale = max(0.3, side / 1200)
    for index, (box, label) in enumerate(zip(boxes_xyxy.round().astype(int), labels.astype(int))):
        box_color = color or class_color(int(label))
        x1, y1, x2, y2 = box.tolist()
        cv2.rectangle(tile, (x1, y1), (x2, y2), box_color, thickness, cv2.LINE_AA)
        caption = names[label] if 0 <= label < len(names) else str(label)
        if scores is not None:
            caption = f"{caption} {scores[index]:.2f}"
        (text_w, text_h), baseline = cv2.getTextSize(caption, cv2.FONT_HERSHEY_SIMPLEX, font_scale, 1)
        text_y = y1 - 2 if y1 - text_h - baseline >= 0 else y1 + text_h + 2  # inside the box at the top edge
        cv2.rectangle(tile, (x1, text_y - text_h - 1), (x1 + text_w + 1, text_y + baseline - 1), box_color, -1)
        cv2.putText(tile, caption, (x1 + 1, text_y - 1), cv2.FONT_HERSHEY_SIMPLEX, font_scale, (255, 255, 255), 1,
                    cv2.LINE_AA)


def _write_grid(tiles: list[np.ndarray], out_png: str | Path) -> Path:
    """Lay ``[H, W, 3]`` RGB tiles (all the same size) in a near-square grid and write it as PNG."""
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    if not tiles:
        tiles = [np.full((64, 64, 3), 114, np.uint8)]
    columns = math.ceil(math.sqrt(len(tiles)))
    rows = math.ceil(len(tiles) / columns)
    height, width = tiles[0].shape[:2]
    grid = np.full((rows * (height + TILE_GAP) - TILE_GAP, columns * (width + TILE_GAP) - TILE_GAP, 3), 255, np.uint8)
    for index, tile in enumerate(tiles):
        row, col = divmod(index, columns)
        top, left = row * (height + TILE_GAP), col * (width + TILE_GAP)
        grid[top : top + height, left : left + width] = tile
    return write_image(out_png, cv2.cvtColor(grid, cv2.COLOR_RGB2BGR))  # atomic; raises OSError naming the file


def _tile_scale(count: int, side: int, panels_per_image: int = 1) -> float:
    """Shrink factor so ``count`` images (``panels_per_image`` wide each) fit in :data:`MAX_GRID_SIDE`."""
    columns = math.ceil(math.sqrt(count))
    return min(1.0, MAX_GRID_SIDE / (columns * side * panels_per_image))


def _resized(tile: np.ndarray, scale: float) -> np.ndarray:
    if scale >= 1:
        return tile.copy()
    size = (max(1, round(tile.shape[1] * scale)), max(1, round(tile.shape[0] * scale)))
    return cv2.resize(tile, size, interpolation=cv2.INTER_AREA)


def plot_batch(
    images: torch.Tensor, targets: torch.Tensor, names: list[str], out_png: str | Path, *,
    max_images: int = PLOTTED_IMAGES
) -> Path:
    """Draw a training batch with its labels and return ``out_png``.

    Args:
        images: ``uint8 [B, 3, S, S]`` RGB (as the loader yields them; float in [0, 1] also accepted).
        targets: ``[N, 6]`` (image index, class, cx, cy, w, h), coordinates normalised to ``S``.
        names: class names, indexed by class.
        max_images: draw at most this many images of the batch.
    """
    count = min(len(images), max_images)
    tiles = _to_rgb_tiles(images, count)
    targets = targets.detach().cpu().float().reshape(-1, 6).numpy()
    scale = _tile_scale(count, max(images.shape[-2:]) if count else 1)
    for index, tile in enumerate(tiles):
        tile = tiles[index] = _resized(tile, scale)
        rows = targets[targets[:, 0] == index]
        boxes = normalised_to_xyxy(rows[:, 2:6], tile.shape[1], tile.shape[0])
        _draw_boxes(tile, boxes, rows[:, 1], names)
    return _write_grid(tiles, out_png)


def plot_val_predictions(
    images: torch.Tensor,
    predictions: list[dict[str, torch.Tensor]],
    targets: torch.Tensor,
    names: list[str],
    out_png: str | Path,
    *,
    conf_threshold: float = DRAW_CONF,
    max_images: int = 16,
) -> Path:
    """Ground truth (left, green) beside predictions (right, class colours with scores), per image.

    Args:
        images: ``uint8 [B, 3, S, S]`` letterboxed RGB, as the validation loader yields them.
        predictions: per image ``{boxes [n, 4] xyxy pixels of the S x S input, scores [n], labels [n]}``.
        targets: ``[N, 6]`` (image index, class, cx, cy, w, h) normalised to ``S``.
        names: class names.
        conf_threshold: predictions scoring below this are not drawn.
        max_images: draw at most this many images.
    """
    count = min(len(images), len(predictions), max_images)
    side = max(images.shape[-2:]) if count else 1
    scale = _tile_scale(count, side, panels_per_image=2)
    targets = targets.detach().cpu().float().reshape(-1, 6).numpy()
    pairs = []
    for index, tile in enumerate(_to_rgb_tiles(images, count)):
        truth = _resized(tile, scale)
        rows = targets[targets[:, 0] == index]
        _draw_boxes(truth, normalised_to_xyxy(rows[:, 2:6], truth.shape[1], truth.shape[0]), rows[:, 1], names,
                    color=GT_COLOR)
        predicted = _resized(tile, scale)
        detection = predictions[index]
        scores = detection["scores"].detach().float().cpu().numpy()
        keep = scores >= conf_threshold
        to_tile = np.array([predicted.shape[1] / tile.shape[1], predicted.shape[0] / tile.shape[0]] * 2)
        boxes = detection["boxes"].detach().float().cpu().numpy().reshape(-1, 4)[keep] * to_tile
        _draw_boxes(predicted, boxes, detection["labels"].cpu().numpy()[keep], names, scores=scores[keep])
        separator = np.full((truth.shape[0], PAIR_GAP, 3), 255, np.uint8)
        pairs.append(np.concatenate((truth, separator, predicted), 1))
    return _write_grid(pairs, out_png)
