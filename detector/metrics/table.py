"""Per-class validation table: images, instances, P / R at the best-F1 threshold, COCO AP (detector.metrics.coco)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from detector.data.records import ImageRecord
from detector.metrics.coco import EvalResult

HEADERS = ("Class", "Images", "Instances", "P", "R", "AP50", "AP50-95")


@dataclass(frozen=True)
class ClassRow:
    name: str
    images: int  # images holding at least one box of the class (all images for the "all" row)
    instances: int
    precision: float  # NaN where the class has no ground truth
    recall: float
    ap50: float  # the COCO evaluator's, unrounded
    ap50_95: float


def per_class_rows(
    names: list[str], records: list[ImageRecord], result: EvalResult, precision: np.ndarray, recall: np.ndarray
) -> list[ClassRow]:
    """The ``all`` row, then one row per class, in class order.

    AP columns are exactly ``result.per_class_ap50`` / ``result.per_class_ap`` (the COCO evaluator), and the
    ``all`` row's are ``result.metrics['mAP50']`` / ``['mAP50-95']``; P and R are means over classes
    with ground truth.
    """
    instances = np.zeros(len(names), np.int64)
    images = np.zeros(len(names), np.int64)
    for record in records:
        classes = record.labels[:, 0].astype(np.int64)
        instances += np.bincount(classes, minlength=len(names))[: len(names)]
        images[np.unique(classes)] += 1
    precision, recall = np.asarray(precision, np.float64), np.asarray(recall, np.float64)
    rows = [ClassRow("all", len(records), int(instances.sum()), _nanmean(precision), _nanmean(recall),
                     float(result.metrics["mAP50"]), float(result.metrics["mAP50-95"]))]
    for cls, name in enumerate(names):
        rows.append(ClassRow(name, int(images[cls]), int(instances[cls]), float(precision[cls]),
                             float(recall[cls]), float(result.per_class_ap50[cls]), float(result.per_class_ap[cls])))
    return rows


def _nanmean(values: np.ndarray) -> float:
    return float(np.nanmean(values)) if np.isfinite(values).any() else math.nan


def _number(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{value:.3f}"


def format_rows(rows: list[ClassRow]) -> str:
    """Fixed-width text: right-aligned columns, three decimals, ``-`` for undefined values."""
    name_width = max(len(HEADERS[0]), *(len(row.name) for row in rows)) + 2
    widths = (name_width, 8, 10, 8, 8, 8, 8)
    lines = ["".join(f"{h:>{w}}" if i else f"{h:<{w}}" for i, (h, w) in enumerate(zip(HEADERS, widths)))]
    for row in rows:
        cells = (row.name, str(row.images), str(row.instances), _number(row.precision), _number(row.recall),
                 _number(row.ap50), _number(row.ap50_95))
        lines.append("".join(f"{c:>{w}}" if i else f"{c:<{w}}" for i, (c, w) in enumerate(zip(cells, widths))))
    return "\n".join(lines)


def per_class_table(
    names: list[str], records: list[ImageRecord], result: EvalResult, precision: np.ndarray, recall: np.ndarray
) -> str:
    """Format the validation table (see :func:`per_class_rows` for what each column holds)."""
    return format_rows(per_class_rows(names, records, result, precision, recall))
