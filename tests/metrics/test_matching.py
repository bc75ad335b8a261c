"""Matching, PR curves and the confusion matrix on hand-made cases with known answers."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from detector.data.letterbox import ImageMeta, unletterbox_boxes
from detector.metrics.matching import (
    claim_by_confidence,
    confusion_matrix,
    labels_to_boxes,
    match_dataset,
    match_predictions,
    pr_curves,
)
from detector.plots import plot_all_validation

GT_BOXES = torch.tensor([[0.0, 0, 10, 10], [20, 20, 30, 30]])
GT_LABELS = torch.tensor([0, 1])


def test_one_tp_one_fp_one_fn() -> None:
    # Prediction 0 sits on ground truth 0 (TP); prediction 1 is far from everything (FP);
    # ground truth 1 is never found (FN).
    pred_boxes = torch.tensor([[1.0, 0, 10, 10], [50, 50, 60, 60]])
    pred_labels = torch.tensor([0, 0])
    assert match_predictions(pred_boxes, pred_labels, torch.tensor([0.9, 0.8]), GT_BOXES, GT_LABELS).tolist() == [
        True, False]
    matrix = confusion_matrix(pred_boxes, pred_labels, torch.tensor([0.9, 0.8]), GT_BOXES, GT_LABELS, 2)
    expected = np.zeros((3, 3), int)
    expected[0, 0] = 1  # TP: predicted 0, true 0
    expected[0, 2] = 1  # FP: predicted 0, background
    expected[2, 1] = 1  # FN: class 1 missed
    np.testing.assert_array_equal(matrix, expected)


def test_wrong_class_is_fp_for_pr_and_off_diagonal_in_confusion() -> None:
    pred_boxes, pred_labels = GT_BOXES[:1].clone(), torch.tensor([1])
    assert match_predictions(pred_boxes, pred_labels, torch.tensor([0.9]), GT_BOXES, GT_LABELS).tolist() == [False]
    matrix = confusion_matrix(pred_boxes, pred_labels, torch.tensor([0.9]), GT_BOXES, GT_LABELS, 2)
    assert matrix[1, 0] == 1 and matrix[2, 1] == 1 and matrix.sum() == 2


def test_duplicates_and_thresholds() -> None:
    # Two predictions on one box: the higher-scored one is the TP, even where the other overlaps better (COCO's
    # greedy rule and Ultralytics 8.4's); the other is an FP.
    pred_boxes = torch.tensor([[0.0, 0, 9, 10], [0, 0, 10, 10]])
    for scores, expected in (([0.9, 0.8], [True, False]), ([0.8, 0.9], [False, True])):
        correct = match_predictions(pred_boxes, torch.tensor([0, 0]), torch.tensor(scores), GT_BOXES[:1], GT_LABELS[:1])
        assert correct.tolist() == expected
    # Confusion matrix: a low score is ignored, so the box counts as missed.
    matrix = confusion_matrix(pred_boxes[1:], torch.tensor([0]), torch.tensor([0.2]), GT_BOXES[:1], GT_LABELS[:1], 1)
    np.testing.assert_array_equal(matrix, [[0, 0], [1, 0]])
    # IoU exactly 0.5 counts for the PR matching (>=), as COCO does.
    half = torch.tensor([[0.0, 0, 10, 5]])
    assert match_predictions(half, torch.tensor([0]), torch.ones(1), GT_BOXES[:1], GT_LABELS[:1]).tolist() == [True]


def test_empty_inputs() -> None:
    none = torch.zeros(0, 4)
    assert match_predictions(none, torch.zeros(0), torch.zeros(0), GT_BOXES, GT_LABELS).shape == (0,)
    assert match_predictions(GT_BOXES, GT_LABELS, torch.ones(2), none, torch.zeros(0)).tolist() == [False, False]
    matrix = confusion_matrix(GT_BOXES, GT_LABELS, torch.ones(2), none, torch.zeros(0), 2)
    assert matrix[0, 2] == 1 and matrix[1, 2] == 1 and matrix.sum() == 2


def test_boxes_are_claimed_by_confidence_once_each() -> None:
    iou = np.array([[0.9, 0.8], [0.85, 0.6]])
    # The second prediction scores higher: it takes box 0 (its best), the first then takes box 1.
    gt_index, pred_index = claim_by_confidence(iou, np.array([0.5, 0.9]), 0.5)
    assert sorted(zip(gt_index.tolist(), pred_index.tolist())) == [(0, 1), (1, 0)]
    # A prediction whose best box is taken pairs with nothing, as in Ultralytics (its row is zeroed).
    gt_index, pred_index = claim_by_confidence(np.array([[0.9, 0.8], [0.0, 0.0]]), np.array([0.9, 0.5]), 0.5)
    assert gt_index.tolist() == [0] and pred_index.tolist() == [0]


def test_the_confusion_matrix_is_ultralytics_on_random_scenes(tmp_path: Path) -> None:
    """Against Ultralytics 8.4's own ``ConfusionMatrix.process_batch`` (the reference, a dev extra) on crowded
    random scenes where pairing by IoU and claiming by confidence disagree. Ultralytics runs in a child process:
    importing it patches this one for good (``PIL.Image.open`` among others)."""
    if importlib.util.find_spec("ultralytics") is None:  # looked for, not imported (see above)
        pytest.skip("ultralytics (the dev extra) is not installed")
    generator = torch.Generator().manual_seed(0)
    classes = 4
    ours = np.zeros((classes + 1, classes + 1), np.int64)
    scenes = []
    for _ in range(40):
        gt_boxes = random_boxes(12, generator)
        gt_labels = torch.randint(0, classes, (12,), generator=generator)
        jitter = torch.randn(30, 4, generator=generator) * 6
        pred_boxes = gt_boxes[torch.randint(0, 12, (30,), generator=generator)] + jitter
        pred_boxes = torch.cat((pred_boxes[:, :2], torch.maximum(pred_boxes[:, 2:], pred_boxes[:, :2] + 1)), 1)
        pred_labels = torch.randint(0, classes, (30,), generator=generator)
        scores = torch.rand(30, generator=generator)
        ours += confusion_matrix(pred_boxes, pred_labels, scores, gt_boxes, gt_labels, classes)
        scenes.append((pred_boxes, pred_labels, scores, gt_boxes, gt_labels))
    torch.save(scenes, tmp_path / "scenes.pt")
    code = f"""
import json, torch
from ultralytics.utils.metrics import ConfusionMatrix
matrix = ConfusionMatrix(names={{i: str(i) for i in range({classes})}})
for boxes, labels, scores, gt_boxes, gt_labels in torch.load({str(tmp_path / "scenes.pt")!r}):
    matrix.process_batch({{"bboxes": boxes, "conf": scores, "cls": labels.float()}},
                         {{"bboxes": gt_boxes, "cls": gt_labels.float()}})
print(json.dumps(matrix.matrix.astype(int).tolist()))
"""
    env = {**os.environ, "YOLO_OFFLINE": "1", "YOLO_CONFIG_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    np.testing.assert_array_equal(ours, json.loads(result.stdout.strip().splitlines()[-1]))


def random_boxes(count: int, generator: torch.Generator) -> torch.Tensor:
    corners = torch.rand(count, 2, generator=generator) * 80
    return torch.cat((corners, corners + 10 + torch.rand(count, 2, generator=generator) * 30), 1)


def test_the_table_p_and_r_are_ultralytics_ap_per_class_on_random_scenes(tmp_path: Path) -> None:
    """P and R per class and for ``all`` against Ultralytics 8.4's own matching and ``ap_per_class`` (a child
    process, as above) on random scenes. Class 3 has boxes and no detection (P 0, R 0 in both), class 4 detections
    and no box (ours NaN and out of ``all``; Ultralytics leaves it out). Scores are distinct: the order of tied
    scores, which Ultralytics' unstable sort leaves open, moves its interpolated P / R."""
    if importlib.util.find_spec("ultralytics") is None:  # looked for, not imported (see the confusion-matrix test)
        pytest.skip("ultralytics (the dev extra) is not installed")
    generator = torch.Generator().manual_seed(1)
    classes = 5
    correct, scores, labels, gt_all, scenes = [], [], [], [], []
    for _ in range(40):
        gt_boxes = random_boxes(10, generator)
        gt_labels = torch.randint(0, 4, (10,), generator=generator)
        source = torch.randint(0, 10, (25,), generator=generator)
        jitter = torch.randn(25, 4, generator=generator) * 6
        pred_boxes = gt_boxes[source] + jitter
        pred_boxes = torch.cat((pred_boxes[:, :2], torch.maximum(pred_boxes[:, 2:], pred_boxes[:, :2] + 1)), 1)
        guessed = torch.tensor([0, 1, 2, 4])[torch.randint(0, 4, (25,), generator=generator)]
        right = (torch.rand(25, generator=generator) < 0.7) & (gt_labels[source] != 3)
        pred_labels = torch.where(right, gt_labels[source], guessed)
        # Close, rightly labelled boxes score high, so the mean F1 peaks between scores, where the definitions part.
        # float32, as detections come; float64 in pr_curves, as match_dataset hands them over.
        pred_scores = torch.exp(-jitter.abs().mean(1) / 4) * (0.5 + 0.5 * torch.rand(25, generator=generator))
        pred_scores = torch.where(right, pred_scores, pred_scores * 0.5)
        correct.append(match_predictions(pred_boxes, pred_labels, pred_scores, gt_boxes, gt_labels))
        scores.append(pred_scores.double().numpy())
        labels.append(pred_labels.numpy())
        gt_all.append(gt_labels.numpy())
        scenes.append((pred_boxes, pred_labels, pred_scores, gt_boxes, gt_labels))
    scores_all = np.concatenate(scores)
    assert len(np.unique(scores_all)) == len(scores_all)
    curves = pr_curves(np.concatenate(correct), scores_all, np.concatenate(labels), np.concatenate(gt_all), classes)
    torch.save(scenes, tmp_path / "scenes.pt")
    code = f"""
import json, numpy as np, torch
from ultralytics.engine.validator import BaseValidator
from ultralytics.utils.metrics import ap_per_class, box_iou
validator = object.__new__(BaseValidator)  # match_predictions reads iouv alone
validator.iouv = torch.tensor([0.5])
tp, conf, pred_cls, target_cls = [], [], [], []
for boxes, labels, scores, gt_boxes, gt_labels in torch.load({str(tmp_path / "scenes.pt")!r}):
    order = scores.argsort(descending=True)  # Ultralytics' NMS hands over detections by descending score
    matched = validator.match_predictions(labels[order], gt_labels, box_iou(gt_boxes, boxes[order])).numpy()
    tp.append(matched[order.argsort()])  # back in the scene's order, beside its scores and classes
    conf.append(scores.numpy()), pred_cls.append(labels.numpy()), target_cls.append(gt_labels.numpy())
out = ap_per_class(np.concatenate(tp), np.concatenate(conf), np.concatenate(pred_cls), np.concatenate(target_cls))
print(json.dumps({{"tp": np.concatenate(tp)[:, 0].tolist(), "p": out[2].tolist(), "r": out[3].tolist(),
                  "classes": out[6].tolist()}}))
"""
    env = {**os.environ, "YOLO_OFFLINE": "1", "YOLO_CONFIG_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    theirs = json.loads(result.stdout.strip().splitlines()[-1])
    np.testing.assert_array_equal(np.concatenate(correct), theirs["tp"])  # the same true positives go in
    assert 0.1 < curves.best_confidence < 0.9  # inside the scores' range: read between two of them, not at one end
    assert theirs["classes"] == [0, 1, 2, 3]
    # Both evaluate the same float64 operations on the same arrays (tp / n and Ultralytics' tp / (n + 1e-16) round
    # to one value for n >= 1), so per class they agree exactly; the means differ by summation order at most, which
    # bounds their gap by classes * eps.
    np.testing.assert_array_equal(curves.best_precision[:4], theirs["p"])
    np.testing.assert_array_equal(curves.best_recall[:4], theirs["r"])
    assert np.isnan(curves.best_precision[4]) and np.isnan(curves.best_recall[4])
    assert curves.best_recall[3] == 0 and curves.best_precision[3] == 0
    eps = classes * np.finfo(np.float64).eps
    assert abs(np.nanmean(curves.best_precision) - np.mean(theirs["p"])) <= eps
    assert abs(np.nanmean(curves.best_recall) - np.mean(theirs["r"])) <= eps


def test_pr_curves_known_values() -> None:
    # Class 0: 2 ground truths; predictions by score: TP (0.9), FP (0.8), TP (0.7).
    # Class 1: 1 ground truth, never predicted. Class 2: no ground truth, one FP.
    correct = np.array([True, False, True, False])
    scores = np.array([0.9, 0.8, 0.7, 0.6])
    labels = np.array([0, 0, 0, 2])
    curves = pr_curves(correct, scores, labels, np.array([0, 0, 1]), 3)
    assert curves.instances.tolist() == [2, 1, 0]
    # Envelope: precision 1 up to recall 0.5, then 2/3 up to recall 1 -> 101-point AP.
    expected_ap = (51 * 1.0 + 50 * 2 / 3) / 101
    assert np.isclose(curves.ap50[0], expected_ap) and curves.ap50[1] == 0 and np.isnan(curves.ap50[2])
    assert np.isnan(curves.best_precision[2]) and np.isnan(curves.best_recall[2])
    grid = np.linspace(0, 1, 1000)
    at = lambda conf: int(np.abs(grid - conf).argmin())  # noqa: E731
    # Between the scores 0.8 (P 1/2, R 1/2) and 0.7 (P 2/3, R 1) P and R are linear in the threshold, as
    # Ultralytics' ap_per_class interpolates them; below the lowest score they hold, above the highest P 1, R 0.
    share = (0.8 - grid[at(0.75)]) / (0.8 - 0.7)  # of the way from the 0.8 detection to the 0.7 one
    assert np.isclose(curves.recall[0, at(0.75)], 0.5 + share * 0.5)
    assert np.isclose(curves.precision[0, at(0.75)], 0.5 + share * (2 / 3 - 0.5))
    assert curves.recall[0, at(0.5)] == 1.0 and np.isclose(curves.precision[0, at(0.5)], 2 / 3)
    assert curves.recall[0, at(0.95)] == 0 and curves.precision[0, at(0.95)] == 1  # nothing predicted yet


def test_coordinate_conversions() -> None:
    meta = ImageMeta(image_id=0, original_hw=(50, 100), ratio=0.64, pad=(0.0, 16.0))
    original = torch.tensor([[10.0, 5, 60, 45]])
    letterboxed = original * meta.ratio + torch.tensor([0, 16, 0, 16])
    torch.testing.assert_close(unletterbox_boxes(letterboxed, meta), original)
    classes, boxes = labels_to_boxes(np.array([[1, 0.5, 0.5, 0.2, 0.4]]), (50, 100))
    assert classes.tolist() == [1]
    torch.testing.assert_close(boxes, torch.tensor([[40.0, 15, 60, 35]]))


def perfect_predictions(split) -> list:
    """Ground truth turned into letterboxed-pixel predictions with score 0.9."""
    predictions = []
    for index in range(len(split.dataset)):
        _, labels, meta = split.dataset[index]
        size = split.dataset.image_size
        centre, side = labels[:, 1:3] * size, labels[:, 3:5] * size
        boxes = torch.cat((centre - side / 2, centre + side / 2), 1)
        detection = {"boxes": boxes, "scores": torch.full((len(labels),), 0.9), "labels": labels[:, 0].long()}
        predictions.append((detection, meta))
    return predictions


def test_perfect_predictions_give_full_precision_and_recall(tiny_split, tmp_path: Path, assert_png) -> None:
    predictions = perfect_predictions(tiny_split)
    matches = match_dataset(predictions, tiny_split.records, tiny_split.image_hw, 2)
    assert matches.correct.all() and len(matches.gt_labels) == 4
    np.testing.assert_array_equal(matches.confusion, [[2, 0, 0], [0, 2, 0], [0, 0, 0]])
    stats = plot_all_validation(predictions, tiny_split, ["square", "bar"], tmp_path / "val")
    np.testing.assert_allclose(stats.precision, [1, 1])
    np.testing.assert_allclose(stats.recall, [1, 1])
    assert {p.name for p in stats.files} == {"PR_curve.png", "confusion_matrix.png", "confusion_matrix_normalized.png",
                                             "val_batch0_pred.png"}
    for path in stats.files:
        assert_png(path)


def test_the_confusion_matrix_is_drawn_in_counts_and_normalised_under_ultralytics_names(tiny_split, tmp_path) -> None:
    """Only the normalised matrix was drawn, under the name Ultralytics gives its counts (confusion_matrix.png)."""
    drawn = {}
    plot_all_validation(perfect_predictions(tiny_split), tiny_split, ["square", "bar"], tmp_path, max_images=0,
                        draw=lambda name, *args: drawn.update({Path(args[2]).name: (name, args[3:])}))
    assert drawn == {"PR_curve.png": ("plot_pr_curves", ()),
                     "confusion_matrix.png": ("plot_confusion_matrix", (False,)),  # counts
                     "confusion_matrix_normalized.png": ("plot_confusion_matrix", (True,))}


def test_images_without_predictions_count_as_misses(tiny_split) -> None:
    predictions = perfect_predictions(tiny_split)[:1]  # only the first image was predicted
    matches = match_dataset(predictions, tiny_split.records, tiny_split.image_hw, 2)
    assert matches.correct.sum() == 2 and len(matches.gt_labels) == 4
    assert matches.confusion[2].tolist() == [1, 1, 0]


def test_a_high_scored_detection_keeps_its_box_from_a_better_overlapping_duplicate() -> None:
    """A (score 0.9) overlaps the box by 0.8, its duplicate B (0.3) by 0.95. In score order A takes the box, as COCO
    and Ultralytics 8.4 count it; pairing by IoU gave it to B, so that above a confidence threshold of 0.5 (where P and
    R are read) A was a false positive and the box a miss."""
    gt = torch.tensor([[0.0, 0, 10, 10]])
    a = torch.tensor([[0.0, 0, 10, 8.0]])
    b = torch.tensor([[0.0, 0, 10, 9.5]])
    correct = match_predictions(torch.cat((a, b)), torch.tensor([0, 0]), torch.tensor([0.9, 0.3]), gt,
                                torch.tensor([0]))
    assert correct.tolist() == [True, False]  # by IoU: [False, True]


def test_a_detection_in_a_crowd_region_is_left_out_of_precision_as_coco_leaves_it(tmp_path: Path) -> None:
    """The ground truth fed back as detections, plus one inside a crowd region of its class: COCO's evaluation
    ignores that one (mAP50 1.0), and so do P / R and the PR curves now (it was a false positive); the confusion
    matrix counts it as Ultralytics' does."""
    from detector.data.build import build_split
    from detector.data.spec import load_dataset_spec
    from detector.metrics.loop import make_val_loader, run_validation
    from detector.metrics.matching import crowd_regions, validation_stats
    from tests.conftest import write_coco_dataset

    yaml = write_coco_dataset(tmp_path / "c", count=2)
    truth = json.loads((tmp_path / "c" / "instances.json").read_text())
    crowd = [40.0, 40.0, 20.0, 20.0]
    truth["annotations"].append({"id": 999, "image_id": 100, "category_id": 9, "bbox": crowd, "area": 400,
                                 "iscrowd": 1})
    (tmp_path / "c" / "instances.json").write_text(json.dumps(truth))
    split = build_split(load_dataset_spec(yaml), "val", image_size=64, augment=None, cache="none")
    assert {image: regions[0].tolist() for image, regions in crowd_regions(split).items()} == {100: [1]}
    batches = list(make_val_loader(split, batch_size=2, workers=0, rect=False))
    truth_boxes = {r.image_id: labels_to_boxes(r.labels, hw) for r, hw in zip(split.records, split.image_hw)}

    def oracle(images: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        out = []
        for meta in batches[0][2]:
            classes, boxes = truth_boxes[meta.image_id]
            letterboxed = boxes * meta.ratio + torch.tensor([meta.pad[0], meta.pad[1]] * 2)
            scores = torch.full((len(boxes),), 0.8)
            if meta.image_id == 100:  # one more, inside the crowd region, of its class, scored above them
                inside = torch.tensor([[42.0, 42.0, 58.0, 58.0]]) * meta.ratio + torch.tensor([meta.pad[0],
                                                                                                 meta.pad[1]] * 2)
                letterboxed, classes = torch.cat((letterboxed, inside)), torch.cat((classes, torch.tensor([1])))
                scores = torch.cat((scores, torch.tensor([0.9])))
            out.append({"boxes": letterboxed, "scores": scores, "labels": classes})
        return out

    validation = run_validation(oracle, split, batches, progress=False, keep_predictions=True)
    assert validation.metrics["mAP50"] == pytest.approx(1.0)
    stats = validation_stats(validation.predictions, split, 3)
    assert np.nanmin(stats.precision) == 1.0 and np.nanmin(stats.recall) == 1.0
    assert stats.matches.confusion[1, 3] == 1  # the background column: a false positive to Ultralytics


def noisy_predictions(split) -> list:
    """:func:`perfect_predictions` with, per image, a duplicate of each box 3 px off (score 0.5) and a box on no object
    (class 0, score 0.7): P and R strictly between 0 and 1."""
    predictions = []
    for detection, meta in perfect_predictions(split):
        boxes, labels = detection["boxes"], detection["labels"]
        boxes = torch.cat((boxes, boxes + 3.0, torch.tensor([[1.0, 1.0, 9.0, 9.0]])))
        scores = torch.cat((detection["scores"], torch.full((len(labels),), 0.5), torch.tensor([0.7])))
        predictions.append(({"boxes": boxes, "scores": scores, "labels": torch.cat((labels, labels, torch.tensor([0])))},
                            meta))
    return predictions


def test_prediction_rows_hold_the_numbers_matching_reads_and_p_and_r_skip_the_confusion_matrix(tiny_split) -> None:
    """A pass's predictions as one array (what a background scorer is sent): each box in its image's pixels exactly as
    unletterbox_boxes gives it, its score and class; matched from it, an epoch's P and R are the val table's "all" row
    to the bit, in any order of its images, without the confusion matrix that P and R do not read."""
    from detector.metrics.matching import mean_precision_recall, prediction_rows, stats_of_rows, validation_stats

    predictions = noisy_predictions(tiny_split)
    rows = prediction_rows(predictions)
    assert rows.shape == (sum(len(d["scores"]) for d, _ in predictions), 7) and rows.dtype == np.float64
    for detection, meta in predictions:
        mine = rows[rows[:, 0] == meta.image_id]
        assert torch.equal(torch.from_numpy(mine[:, 1:5].astype(np.float32)), unletterbox_boxes(detection["boxes"], meta))
        assert torch.equal(torch.from_numpy(mine[:, 5].astype(np.float32)), detection["scores"])
        assert mine[:, 6].tolist() == detection["labels"].tolist()
    table = validation_stats(predictions, tiny_split, 2)  # what `detector val` prints
    assert 0 < table.mean_precision < 1 and 0 < table.mean_recall <= 1
    assert mean_precision_recall(rows, tiny_split) == (table.mean_precision, table.mean_recall)
    assert mean_precision_recall(prediction_rows(predictions[::-1]), tiny_split) == (table.mean_precision,
                                                                                  table.mean_recall)
    assert stats_of_rows(rows, tiny_split, 2, confusion=False).matches.confusion is None
    assert prediction_rows([]).shape == (0, 7) and mean_precision_recall(prediction_rows([]), tiny_split) == (0.0, 0.0)
