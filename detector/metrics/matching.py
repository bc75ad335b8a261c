"""Prediction <-> ground-truth matching at one IoU threshold, PR curves and the confusion matrix.

These numbers feed the plots and the P / R columns of the val table only; mAP always comes from
pycocotools (``detector.metrics.coco``). For P / R, predictions claim ground truth in descending confidence, each
the best-overlapping box not yet claimed, as COCO's evaluation and Ultralytics 8.4's validator match them
(:func:`match_predictions`); the confusion matrix claims boxes class-agnostically by confidence, as Ultralytics 8.4's
does (:func:`claim_by_confidence`). Each
prediction and each ground-truth box is used once. All boxes are xyxy pixels of the original image. P and R are
Ultralytics 8.4's ``ap_per_class`` values (:func:`pr_curves`): each class's curves against confidence interpolated
between its detections' scores, read where the smoothed mean F1 peaks. A training epoch's ``P`` and ``R`` columns are
the same table's "all" row (:func:`mean_precision_recall`), without the confusion matrix.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from detector.boxes import box_intersection, box_iou, cxcywh_to_xyxy
from detector.data.build import SplitData
from detector.data.letterbox import ImageMeta, unletterbox_rows
from detector.data.records import ImageRecord
from detector.metrics.coco import EvalResult

CONF_GRID = np.linspace(0, 1, 1000)  # confidence thresholds at which P, R and F1 are sampled
RECALL_GRID = np.linspace(0, 1, 101)  # COCO's 101 recall points, for the PR plot and its AP50 legend
PR_IOU = 0.5  # TP/FP decision for the PR curves
CM_CONF, CM_IOU = 0.25, 0.45  # confusion-matrix thresholds, as Ultralytics uses
F1_SMOOTH = 0.1  # fraction of the confidence grid averaged when picking the best-F1 threshold


def labels_to_boxes(labels: np.ndarray, image_hw: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``[n, 5]`` (class, cx, cy, w, h normalised) -> classes ``[n]`` long and xyxy pixel boxes ``[n, 4]``."""
    labels = torch.as_tensor(np.asarray(labels, dtype=np.float32)).reshape(-1, 5)
    height, width = image_hw
    scale = torch.tensor([width, height, width, height], dtype=torch.float32)
    return labels[:, 0].long(), cxcywh_to_xyxy(labels[:, 1:5]) * scale


def claim_by_confidence(iou: np.ndarray, scores: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """One-to-one pairs of ``iou [M gt, N pred]`` as Ultralytics 8.4's confusion matrix makes them: in descending
    score, each prediction overlapping some box above ``threshold`` takes the box it overlaps most, if that box is
    still free (a claimed box's row is zeroed, so a prediction whose best box is taken pairs with nothing).

    Returns ``(gt_index [K], pred_index [K])``. Pairing by IoU instead (each box its best prediction) put 8 of 6,561
    cells of a coco128 matrix one count apart from Ultralytics' (the diagonal and totals equal).
    """
    iou = iou.copy()
    gt_match = np.full(iou.shape[0], -1)
    candidates = np.flatnonzero((iou > threshold).any(0))
    for pred in candidates[np.argsort(-scores[candidates], kind="stable")]:
        gt = int(iou[:, pred].argmax())
        if iou[gt, pred] > threshold:
            gt_match[gt] = pred
            iou[gt] = 0
    matched = np.flatnonzero(gt_match >= 0)
    return matched, gt_match[matched]


def match_predictions(
    pred_boxes: torch.Tensor,
    pred_labels: torch.Tensor,
    pred_scores: torch.Tensor,
    gt_boxes: torch.Tensor,
    gt_labels: torch.Tensor,
    *,
    iou_threshold: float = PR_IOU,
) -> np.ndarray:
    """Which predictions are true positives: in descending score, each claims the unclaimed box of its class it
    overlaps most, if that IoU is >= ``iou_threshold`` (COCO's greedy rule, and Ultralytics 8.4's). Pairing by IoU
    instead gave a duplicate the box when it overlapped better than the higher-scored detection, which P / R at a
    confidence threshold then counted as a miss and a false positive (BCCD: P 0.75 / R 0.42 against 0.86 / 0.54).

    Args: ``pred_boxes [N, 4]``, ``pred_labels [N]``, ``pred_scores [N]``, ``gt_boxes [M, 4]``, ``gt_labels [M]``
    (xyxy pixels). Returns ``correct``: bool ``[N]``.
    """
    correct = np.zeros(len(pred_boxes), dtype=bool)
    if not len(pred_boxes) or not len(gt_boxes):
        return correct
    iou = box_iou(gt_boxes.float().cpu(), pred_boxes.float().cpu()).numpy()
    same_class = gt_labels.view(-1, 1).cpu().numpy() == pred_labels.view(1, -1).cpu().numpy()
    iou = np.where(same_class & (iou >= iou_threshold), iou, -1.0)
    order = np.argsort(-pred_scores.float().cpu().numpy(), kind="stable")
    candidates = order[(iou[:, order] >= 0).any(0)]  # only predictions with a box to claim: tens per image
    # Each candidate's boxes by IoU, best first (equal IoUs: the lower index first, as argmax picks), those it may
    # claim first; the claims then run over plain lists. A NumPy call or two per candidate took ~9 ms a BCCD pass (a
    # trained nano: 4,300 candidates in 87 images; its P and R took 21 ms in all), ~3 ms this way (profiled).
    ranked = np.argsort(-iou[:, candidates], axis=0, kind="stable")
    claimable = (iou[:, candidates] >= 0).sum(0)
    claimed = [False] * len(gt_boxes)
    for j, boxes, count in zip(candidates.tolist(), ranked.T.tolist(), claimable.tolist()):
        for k in boxes[:count]:
            if not claimed[k]:
                correct[j] = claimed[k] = True
                break
    return correct


def confusion_matrix(
    pred_boxes: torch.Tensor,
    pred_labels: torch.Tensor,
    pred_scores: torch.Tensor,
    gt_boxes: torch.Tensor,
    gt_labels: torch.Tensor,
    num_classes: int,
    *,
    conf_threshold: float = CM_CONF,
    iou_threshold: float = CM_IOU,
) -> np.ndarray:
    """One image's ``[C + 1, C + 1]`` count matrix (rows: predicted class, columns: true class); a split's is the sum.

    Index ``C`` is background: ``[C, j]`` counts missed boxes of class ``j``, ``[i, C]`` predictions of
    class ``i`` that match nothing. Matching is class-agnostic (so confusions show up off the diagonal)
    over predictions scoring above ``conf_threshold`` with IoU above ``iou_threshold``.
    """
    matrix = np.zeros((num_classes + 1, num_classes + 1), np.int64)
    keep = (pred_scores > conf_threshold).cpu()
    pred_boxes, pred_labels = pred_boxes.cpu()[keep], pred_labels.cpu()[keep].long().numpy()
    scores = pred_scores.cpu()[keep].float().numpy()
    gt_labels = gt_labels.cpu().long().numpy()
    gt_index = pred_index = np.zeros(0, dtype=np.int64)
    if len(pred_boxes) and len(gt_boxes):
        iou = box_iou(gt_boxes.float().cpu(), pred_boxes.float()).numpy()
        gt_index, pred_index = claim_by_confidence(iou, scores, iou_threshold)
    np.add.at(matrix, (pred_labels[pred_index], gt_labels[gt_index]), 1)
    missed = np.setdiff1d(np.arange(len(gt_labels)), gt_index)
    np.add.at(matrix, (num_classes, gt_labels[missed]), 1)
    unmatched = np.setdiff1d(np.arange(len(pred_labels)), pred_index)
    np.add.at(matrix, (pred_labels[unmatched], num_classes), 1)
    return matrix


@dataclass
class DatasetMatches:
    """Every prediction of a split with its TP flag, plus ground-truth counts and the confusion matrix."""

    correct: np.ndarray  # [N] bool, TP at PR_IOU
    scores: np.ndarray  # [N]
    labels: np.ndarray  # [N] predicted class
    gt_labels: np.ndarray  # [M] class of every ground-truth box
    confusion: np.ndarray | None  # [C + 1, C + 1] counts, see confusion_matrix; None where not asked for


Crowds = dict[int, tuple[np.ndarray, np.ndarray]]  # image id -> crowd regions' (class [K], xyxy px boxes [K, 4])


def crowd_regions(split: SplitData) -> Crowds:
    """Per image id, the ``iscrowd`` annotations of the split's COCO ground truth, in the image's own pixels and
    class indices (none for YOLO txt data: its labels have no crowds)."""
    if split.ground_truth is None:
        return {}
    index_of = {category: index for index, category in enumerate(split.category_ids)}
    found: dict[int, list[list[float]]] = {}
    for ann in split.ground_truth.dataset.get("annotations", []):
        if ann.get("iscrowd") and ann["category_id"] in index_of:
            x, y, w, h = ann["bbox"]
            scale = (split.json_scale or {}).get(ann["image_id"], 1.0)  # JSON pixels per image pixel
            found.setdefault(ann["image_id"], []).append(
                [index_of[ann["category_id"]], x / scale, y / scale, (x + w) / scale, (y + h) / scale])
    return {image: (np.array(rows)[:, 0].astype(np.int64), np.array(rows, np.float32)[:, 1:])
            for image, rows in found.items()}


def in_crowd(pred_boxes: torch.Tensor, pred_labels: torch.Tensor, correct: np.ndarray,
             crowd: tuple[np.ndarray, np.ndarray] | None, iou_threshold: float = PR_IOU) -> np.ndarray:
    """Which predictions COCO's evaluation ignores: not true positives, yet inside a crowd region of their class
    (its intersection at least ``iou_threshold`` of the prediction's area: COCO's IoU with a crowd)."""
    ignored = np.zeros(len(pred_boxes), dtype=bool)
    if crowd is None or not len(pred_boxes):
        return ignored
    classes, regions = crowd
    boxes = pred_boxes.float().cpu()
    inter = box_intersection(boxes, torch.from_numpy(regions)).numpy()
    area = (boxes[:, 2:] - boxes[:, :2]).clamp(min=0).prod(1).numpy()[:, None]
    covered = inter >= iou_threshold * np.maximum(area, 1e-9)
    same_class = pred_labels.cpu().numpy()[:, None] == classes[None, :]
    return (covered & same_class).any(1) & ~correct


Predictions = list[tuple[dict[str, torch.Tensor], ImageMeta]]  # run_validation(..., keep_predictions=True)
ROW_COLUMNS = ("image_id", "x1", "y1", "x2", "y2", "score", "class")  # prediction_rows' [N, 7] rows


def prediction_rows(predictions: Predictions) -> np.ndarray:
    """A pass's predictions (per image ``({boxes [n, 4] letterboxed xyxy px, scores, labels}, meta)``) as one float64
    ``[N, 7]`` array of :data:`ROW_COLUMNS`: boxes in the original image's pixels (the letterbox undone and clipped),
    each value the FP32 number (the label: the integer) that :func:`match_rows` reads, exact in float64.

    One array, not three tensors an image: a pass scored in the background sends it to the scoring worker
    (detector/metrics/background.py), and :func:`match_dataset` reads the same rows, so the two match alike.
    """
    if not predictions:
        return np.zeros((0, len(ROW_COLUMNS)))
    detections, metas = zip(*predictions)
    counts = [len(detection["scores"]) for detection in detections]
    # The whole pass at once: unletterbox_rows gives each box the bits a per-image unletterbox_boxes would.
    boxes = unletterbox_rows(torch.cat([d["boxes"].reshape(-1, 4) for d in detections]), metas, counts)
    rows = np.empty((sum(counts), len(ROW_COLUMNS)))
    rows[:, 0] = np.repeat(np.array([meta.image_id for meta in metas], np.float64), counts)
    rows[:, 1:5] = boxes.numpy()
    rows[:, 5] = torch.cat([d["scores"].reshape(-1) for d in detections]).float().cpu().numpy()
    rows[:, 6] = torch.cat([d["labels"].reshape(-1) for d in detections]).long().cpu().numpy()
    return rows


def match_dataset(
    predictions: Predictions,
    records: list[ImageRecord],
    image_hw: list[tuple[int, int]],
    num_classes: int,
    crowds: Crowds | None = None,
) -> DatasetMatches:
    """Match ``run_validation(..., keep_predictions=True)`` predictions against the records' labels
    (:func:`match_rows` of their :func:`prediction_rows`)."""
    return match_rows(prediction_rows(predictions), records, image_hw, num_classes, crowds)


def match_rows(
    rows: np.ndarray,
    records: list[ImageRecord],
    image_hw: list[tuple[int, int]],
    num_classes: int,
    crowds: Crowds | None = None,
    *,
    confusion: bool = True,
) -> DatasetMatches:
    """Match a pass's :func:`prediction_rows` against the records' labels, image by image (``rows[:, 0]`` names each
    box's image). Images without predictions still count their ground truth. ``confusion=False``: no confusion
    matrix (None), which P and R do not read.

    A prediction in a crowd region (``crowds``, :func:`crowd_regions`) that matches no box is left out of P / R and
    the PR curves, as COCO's evaluation ignores it (counted as a false positive, P on COCO read lower than its
    mAP); the confusion matrix counts it as Ultralytics' does, which reads no crowds.
    """
    rows = rows[np.argsort(rows[:, 0], kind="stable")]  # each image's boxes together, in their own order
    image_ids = np.array([record.image_id for record in records], np.float64)
    starts = np.searchsorted(rows[:, 0], image_ids, side="left")
    ends = np.searchsorted(rows[:, 0], image_ids, side="right")
    correct, scores, labels, gt_all = [], [], [], []
    matrix = np.zeros((num_classes + 1, num_classes + 1), np.int64) if confusion else None
    for record, hw, start, end in zip(records, image_hw, starts, ends):
        gt_labels, gt_boxes = labels_to_boxes(record.labels, hw)
        image = rows[start:end]
        boxes = torch.from_numpy(image[:, 1:5].astype(np.float32))
        pred_scores = torch.from_numpy(image[:, 5].astype(np.float32))
        pred_labels = torch.from_numpy(image[:, 6].astype(np.int64))
        matched = match_predictions(boxes, pred_labels, pred_scores, gt_boxes, gt_labels)
        if matrix is not None:
            matrix += confusion_matrix(boxes, pred_labels, pred_scores, gt_boxes, gt_labels, num_classes)
        counted = ~in_crowd(boxes, pred_labels, matched, (crowds or {}).get(record.image_id))
        correct.append(matched[counted])
        scores.append(pred_scores.numpy()[counted])
        labels.append(pred_labels.numpy()[counted])
        gt_all.append(gt_labels.numpy())

    def join(parts: list[np.ndarray], dtype: type) -> np.ndarray:
        return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)

    return DatasetMatches(join(correct, bool), join(scores, np.float64), join(labels, np.int64),
                          join(gt_all, np.int64), matrix)


@dataclass
class PRCurves:
    """Per-class curves at IoU 0.5. Classes without ground truth have NaN best P / R and AP50."""

    precision: np.ndarray  # [C, len(CONF_GRID)] precision against confidence, interpolated as Ultralytics does
    recall: np.ndarray  # [C, len(CONF_GRID)]
    f1: np.ndarray  # [C, len(CONF_GRID)]
    precision_at_recall: np.ndarray  # [C, len(RECALL_GRID)] interpolated (monotone) precision, for the PR plot
    ap50: np.ndarray  # [C] mean of precision_at_recall (101-point, COCO style; legend only, not the table)
    instances: np.ndarray  # [C] ground-truth boxes per class
    best_confidence: float  # threshold maximising the (smoothed) mean F1 over classes with ground truth
    best_precision: np.ndarray  # [C] precision at best_confidence
    best_recall: np.ndarray  # [C] recall at best_confidence


def _smooth(values: np.ndarray, fraction: float) -> np.ndarray:
    window = round(len(values) * fraction * 2) // 2 + 1  # odd
    padded = np.concatenate((np.full(window // 2, values[0]), values, np.full(window // 2, values[-1])))
    return np.convolve(padded, np.ones(window) / window, mode="valid")


def pr_curves(
    correct: np.ndarray, scores: np.ndarray, labels: np.ndarray, gt_labels: np.ndarray, num_classes: int
) -> PRCurves:
    """Precision / recall / F1 against confidence, and precision against recall, per class.

    Args: ``correct [N]`` TP flags, ``scores [N]``, ``labels [N]`` predicted classes (all predictions of a
    split), ``gt_labels [M]`` classes of all ground-truth boxes.

    As Ultralytics 8.4's ``ap_per_class``: P and R on :data:`CONF_GRID` by linear interpolation between the scores
    (tied scores in their given order), the best threshold where the mean F1 over classes with ground truth,
    smoothed over ``F1_SMOOTH`` of the grid, peaks; a class with ground truth and no detection reads P 0, R 0.
    """
    instances = np.bincount(gt_labels.astype(np.int64), minlength=num_classes)[:num_classes]
    order = np.lexsort((-scores, labels))  # by class, then by descending score
    correct, scores, labels = correct[order], scores[order], labels[order]
    bounds = np.searchsorted(labels, np.arange(num_classes + 1))
    shape = (num_classes, len(CONF_GRID))
    precision, recall = np.zeros(shape), np.zeros(shape)
    precision_at_recall = np.zeros((num_classes, len(RECALL_GRID)))
    for cls in range(num_classes):
        start, end = bounds[cls], bounds[cls + 1]
        if start == end or instances[cls] == 0:
            continue
        true_pos = np.cumsum(correct[start:end])
        cls_recall = true_pos / instances[cls]
        cls_precision = true_pos / np.arange(1, end - start + 1)
        # Ultralytics' ap_per_class: P and R interpolated linearly in the confidence between the detections' scores,
        # not read as a step of the threshold, so users comparing the P / R columns with its val compare one
        # definition (the step read P up to 0.023 higher on the oracle test's scenes). Above the highest score:
        # P 1, R 0; below the lowest, every detection's P and R.
        precision[cls] = np.interp(-CONF_GRID, -scores[start:end], cls_precision, left=1.0)
        recall[cls] = np.interp(-CONF_GRID, -scores[start:end], cls_recall, left=0.0)
        envelope = np.maximum.accumulate(cls_precision[::-1])[::-1]
        index = np.searchsorted(cls_recall, RECALL_GRID, side="left")
        reached = index < len(cls_recall)
        precision_at_recall[cls, reached] = envelope[index[reached]]
    f1 = 2 * precision * recall / (precision + recall + 1e-16)
    has_truth = instances > 0
    best = int(_smooth(f1[has_truth].mean(0), F1_SMOOTH).argmax()) if has_truth.any() else 0
    ap50 = precision_at_recall.mean(1)
    nan_without_truth = np.where(has_truth, 1.0, np.nan)
    return PRCurves(
        precision, recall, f1, precision_at_recall, ap50 * nan_without_truth, instances, float(CONF_GRID[best]),
        precision[:, best] * nan_without_truth, recall[:, best] * nan_without_truth,
    )


@dataclass
class ValidationStats:
    precision: np.ndarray  # [C] at best_confidence; NaN for classes without ground truth
    recall: np.ndarray  # [C]
    best_confidence: float
    curves: PRCurves
    matches: DatasetMatches
    files: list[Path] = field(default_factory=list)  # figures written, if any

    @property
    def mean_precision(self) -> float:
        return float(np.nanmean(self.precision)) if np.isfinite(self.precision).any() else 0.0

    @property
    def mean_recall(self) -> float:
        return float(np.nanmean(self.recall)) if np.isfinite(self.recall).any() else 0.0


def validation_stats(predictions: Predictions, split: SplitData, num_classes: int) -> ValidationStats:
    """Match ``run_validation(..., keep_predictions=True).predictions`` to the split's labels: the val table's P and R,
    the PR curves and the confusion matrix. No figures."""
    return stats_of_rows(prediction_rows(predictions), split, num_classes)


def stats_of_rows(rows: np.ndarray, split: SplitData, num_classes: int, *, confusion: bool = True) -> ValidationStats:
    """:func:`validation_stats` of a pass's :func:`prediction_rows`; ``confusion=False``: no confusion matrix."""
    matches = match_rows(rows, split.records, split.image_hw, num_classes, crowd_regions(split), confusion=confusion)
    curves = pr_curves(matches.correct, matches.scores, matches.labels, matches.gt_labels, num_classes)
    return ValidationStats(curves.best_precision, curves.best_recall, curves.best_confidence, curves, matches)


def mean_precision_recall(rows: np.ndarray, split: SplitData) -> tuple[float, float]:
    """The val table's "all" P and R (:attr:`ValidationStats.mean_precision`, :attr:`~ValidationStats.mean_recall`)
    of a pass's :func:`prediction_rows`, without the confusion matrix: a training epoch's ``P`` and ``R`` columns."""
    stats = stats_of_rows(rows, split, len(split.category_ids), confusion=False)
    return stats.mean_precision, stats.mean_recall


def with_precision_recall(result: EvalResult, rows: np.ndarray | None, split: SplitData | None) -> EvalResult:
    """``result`` (a pass's COCO scores) with its :attr:`~EvalResult.mean_precision` and
    :attr:`~EvalResult.mean_recall` (:func:`mean_precision_recall` of the pass's ``rows`` against ``split``); as it
    is where either is None. What scores a pass calls it beside the evaluator, in this process or in the background
    worker (detector/metrics/background.py), so the two paths give the same numbers."""
    if rows is None or split is None:
        return result
    precision, recall = mean_precision_recall(rows, split)
    return dataclasses.replace(result, mean_precision=precision, mean_recall=recall)
