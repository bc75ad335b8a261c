"""evaluate_coco reports pycocotools' own numbers, with either evaluator, for the same predictions.

faster-coco-eval serves validation by default only because of test_faster_coco_eval_gives_pycocotools_numbers.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from pycocotools.cocoeval import COCOeval

from detector.data.letterbox import ImageMeta, unletterbox_boxes
from detector.data.records import ImageRecord
from detector.metrics import coco
from detector.metrics.coco import METRIC_NAMES, cocoeval_stats, evaluate_coco, to_coco_detections
from detector.data.ground_truth import build_coco_ground_truth, load_coco

CLASSES = 5


def noisy_detections(ground_truth: dict, *, per_image: int, seed: int) -> np.ndarray:
    """Jittered copies of the ground truth (some with the wrong class) among random boxes of every size:
    a lively ``[N, 7]`` result array (image_id, x, y, w, h, score, category_id)."""
    rng = np.random.default_rng(seed)
    by_image: dict[int, list[dict]] = {}
    for annotation in ground_truth["annotations"]:
        by_image.setdefault(annotation["image_id"], []).append(annotation)
    rows = []
    for image in ground_truth["images"]:
        width, height, truths = image["width"], image["height"], by_image.get(image["id"], [])
        for _ in range(per_image):
            if truths and rng.random() < 0.5:
                truth = truths[rng.integers(len(truths))]
                x, y, w, h = truth["bbox"]
                box = [x + rng.normal(0, w / 10), y + rng.normal(0, h / 10), w * rng.uniform(0.8, 1.2),
                       h * rng.uniform(0.8, 1.2)]
                category = truth["category_id"] if rng.random() < 0.8 else int(rng.integers(1, CLASSES + 1))
            else:
                w, h = np.exp(rng.uniform(np.log(3), np.log(height), 2))  # small, medium and large
                box = [rng.uniform(0, width - w), rng.uniform(0, height - h), w, h]
                category = int(rng.integers(1, CLASSES + 1))
            rows.append([image["id"], *np.round(box, 3), round(float(rng.random()), 5), category])
    return np.array(rows, np.float64).reshape(-1, 7)


def synthetic_ground_truth(images: int, *, seed: int) -> dict:
    """``images`` 640x480 images: every fifth empty, boxes of all three COCO area ranges, ~10% crowd, class 5
    never in the ground truth (its AP is undefined: nan) while detections still name it."""
    rng = np.random.default_rng(seed)
    records = []
    for index in range(images):
        count = 0 if index % 5 == 0 else int(rng.integers(1, 9))
        sides = np.exp(rng.uniform(np.log(0.01), np.log(0.6), (count, 2)))  # 6 px (small) .. 380 px (large)
        centres = rng.uniform(sides / 2, 1 - sides / 2)
        labels = np.column_stack((rng.integers(0, CLASSES - 1, count), centres, sides)).astype(np.float32)
        records.append(ImageRecord(Path(f"{index}.jpg"), labels, index + 1))
    names = [f"class{k}" for k in range(CLASSES)]
    ground_truth = build_coco_ground_truth(records, [(480, 640)] * images, names, list(range(1, CLASSES + 1)))
    for annotation in ground_truth["annotations"]:
        annotation["iscrowd"] = int(rng.random() < 0.1)  # crowd regions: matched detections are ignored, not TPs
    return ground_truth


def pycocotools_reference(ground_truth: dict, detections: np.ndarray) -> COCOeval:
    """pycocotools run exactly as its README does: loadRes of the results list, evaluate, accumulate, summarize."""
    reference_gt = load_coco(ground_truth)
    results = [{"image_id": int(r[0]), "bbox": r[1:5], "score": r[5], "category_id": int(r[6])}
               for r in detections.tolist()]
    with contextlib.redirect_stdout(io.StringIO()):
        reference = COCOeval(reference_gt, reference_gt.loadRes(results), "bbox")
        reference.evaluate()
        reference.accumulate()
        reference.summarize()
    return reference


@pytest.fixture(scope="module")
def lively_set() -> tuple[dict, np.ndarray]:
    """40 images x 150 detections (beyond maxDets 100, so the cut is exercised)."""
    ground_truth = synthetic_ground_truth(40, seed=0)
    return ground_truth, noisy_detections(ground_truth, per_image=150, seed=1)


def test_pycocotools_backend_is_pycocotools_exactly(lively_set) -> None:
    ground_truth, detections = lively_set
    result = evaluate_coco(load_coco(ground_truth), detections, backend="pycocotools")
    reference = pycocotools_reference(ground_truth, detections)
    assert result.evaluator.startswith("pycocotools ")
    assert np.array_equal(result.stats, reference.stats)
    assert result.metrics == {name: max(float(v), 0.0) for name, v in zip(METRIC_NAMES, reference.stats[:6])}
    assert (reference.stats[:6] > -1).all()  # every size range has ground truth here (left out otherwise: below)
    precision = reference.eval["precision"][:, :, :, 0, -1]
    for k in range(CLASSES - 1):
        valid = precision[:, :, k] > -1
        assert result.per_class_ap[k] == precision[:, :, k][valid].mean()
    assert np.isnan(result.per_class_ap[CLASSES - 1])  # no ground truth: undefined, not zero


def test_faster_coco_eval_gives_pycocotools_numbers(lively_set) -> None:
    pytest.importorskip("faster_coco_eval", reason="faster-coco-eval is not installed (pip install faster-coco-eval)")
    ground_truth, detections = lively_set
    image_ids = [image["id"] for image in ground_truth["images"]]
    faster = cocoeval_stats(load_coco(ground_truth), detections, image_ids=image_ids, backend="faster")
    reference = cocoeval_stats(load_coco(ground_truth), detections, image_ids=image_ids, backend="pycocotools")
    assert faster.evaluator.startswith("faster-coco-eval ") and reference.evaluator.startswith("pycocotools ")
    # Not a vacuous comparison: every area range has ground truth and scores, crowd and empty images are in.
    assert reference.stats[1] > 0.2 and (reference.stats[3:6] > 0).all()
    assert any(a["iscrowd"] for a in ground_truth["annotations"])

    # The issue allows the precision arrays to differ by one unit in the last place (the C++ may sum or
    # divide in another order); every entry here is a ratio in [0, 1] or the -1 "undefined" marker.
    assert faster.precision.shape == reference.precision.shape
    assert np.array_equal(faster.precision == -1, reference.precision == -1)
    ulp = np.spacing(np.maximum(np.abs(faster.precision), np.abs(reference.precision)))
    assert (np.abs(faster.precision - reference.precision) <= ulp).all()
    # Each of the 12 numbers and each class's AP is a mean of such entries (at most 10 x 101 x 5 = 5050 of
    # them). Entries 1 ulp apart (<= 2.2e-16, as they are <= 1) move the mean by <= 2.2e-16, and the two
    # sums' own rounding (numpy's pairwise summation: <= log2(5050) * eps * sum|x| ~ 13 * 2.2e-16 relative,
    # for each side) adds < 6e-15 more: 1e-12, the bound, holds with a wide margin.
    tolerance = 1e-12
    assert np.abs(faster.stats - reference.stats).max() <= tolerance
    assert faster.summary == reference.summary  # the printed table, to its 3 decimals

    fast_result = evaluate_coco(load_coco(ground_truth), detections, backend="faster")
    reference_result = evaluate_coco(load_coco(ground_truth), detections, backend="pycocotools")
    for fast, slow in ((fast_result.per_class_ap, reference_result.per_class_ap),
                       (fast_result.per_class_ap50, reference_result.per_class_ap50)):
        assert np.array_equal(np.isnan(fast), np.isnan(slow))
        assert np.nanmax(np.abs(fast - slow)) <= tolerance


def crowded_detections(ground_truth: dict, *, seed: int) -> np.ndarray:
    """300 detections an image, most of them in two classes (one with ~180 an image, past COCOeval's 100), scores
    of 40 values (ties everywhere, also at each group's 100th), rows in no particular order."""
    detections = noisy_detections(ground_truth, per_image=300, seed=seed)
    rng = np.random.default_rng(seed)
    crowd = rng.random(len(detections)) < 0.85
    detections[crowd, 6] = rng.choice([1, 1, 2], int(crowd.sum()))  # class 1: ~180 an image, class 2: ~95
    detections[:, 5] = np.ceil(detections[:, 5] * 40) / 40
    return detections[rng.permutation(len(detections))]


def test_scored_detections_are_each_image_and_class_best_100_in_row_order() -> None:
    from detector.metrics.coco import SCORED_PER_IMAGE_CLASS, scored_detections

    assert SCORED_PER_IMAGE_CLASS == 100  # COCO's maxDets
    scores = [0.5, 0.9, 0.5, 0.7, 0.5, 0.9]
    others = [[2, 0, 0, 1, 1, 0.1, 3], [1, 0, 0, 1, 1, 0.2, 4]]  # image 2 of class 3; class 4 of image 1
    rows = np.array([[1, 0, 0, 1, 1, score, 3] for score in scores] + others)
    rows[:, 1] = np.arange(len(rows))  # a row's identity
    kept = scored_detections(rows, per_group=4)
    # image 1, class 3: 0.9, 0.9, 0.7 and the first 0.5 (row 0), kept in row order; the other groups whole
    assert kept[:, 1].tolist() == [0, 1, 3, 5, 6, 7]
    few = rows[:3]
    assert scored_detections(few, per_group=4) is few and len(scored_detections(rows[:0])) == 0  # nothing to cut


@pytest.mark.parametrize("backend", ["faster", "pycocotools"])
def test_only_the_detections_cocoeval_reads_are_scored_and_the_numbers_do_not_move(backend) -> None:
    """evaluate_coco hands the evaluator each (image, class)'s best 100 (scored_detections): every number is what
    the evaluator gives for all of them, to the bit, ties at the cut included; the results JSON keeps them all."""
    if backend == "faster":
        pytest.importorskip("faster_coco_eval", reason="faster-coco-eval is not installed")
    from detector.metrics.coco import scored_detections

    ground_truth = synthetic_ground_truth(20, seed=3)
    detections = crowded_detections(ground_truth, seed=4)
    scored = scored_detections(detections)
    assert len(scored) < 0.8 * len(detections)  # groups past 100 were cut (~80 of each image's 300)
    image_ids = [image["id"] for image in ground_truth["images"]]
    whole = cocoeval_stats(load_coco(ground_truth), detections, image_ids=image_ids, backend=backend)
    assert whole.stats[0] > 0.05  # not a vacuous comparison
    result = evaluate_coco(load_coco(ground_truth), detections, image_ids=image_ids, backend=backend)
    assert np.array_equal(result.stats, whole.stats)
    precision = whole.precision[:, :, :, 0, -1]
    for k in range(CLASSES - 1):
        assert result.per_class_ap[k] == precision[:, :, k][precision[:, :, k] > -1].mean()


def test_evaluation_by_category_in_forked_processes_gives_the_one_process_numbers_to_the_bit(
    lively_set, monkeypatch, watchdog
) -> None:
    pytest.importorskip("faster_coco_eval", reason="faster-coco-eval is not installed (pip install faster-coco-eval)")
    ground_truth, detections = lively_set
    image_ids = [image["id"] for image in ground_truth["images"]][3:]  # a subset, as when images were unreadable
    serial = cocoeval_stats(load_coco(ground_truth), detections, image_ids=image_ids, backend="faster")

    monkeypatch.setattr(coco, "PARALLEL_MIN_DETECTIONS", 0)
    monkeypatch.setattr(coco, "usable_cores", lambda: 4)
    faster_gt = coco._as_faster_coco(load_coco(ground_truth))
    parts = coco._category_parts(faster_gt, detections)
    assert len(parts) == 4 and sum(parts, []) == sorted(faster_gt.getCatIds())  # consecutive, all categories
    parallel = cocoeval_stats(load_coco(ground_truth), detections, image_ids=image_ids, backend="faster")
    assert np.array_equal(parallel.stats, serial.stats) and serial.stats[1] > 0.2
    assert np.array_equal(parallel.precision, serial.precision) and parallel.summary == serial.summary

    # A range whose categories have no detections at all (the last class has no ground truth either).
    without_first = detections[detections[:, 6] > 2]
    serial = cocoeval_stats(load_coco(ground_truth), without_first, image_ids=None, backend="faster")
    with contextlib.redirect_stdout(io.StringIO()):
        evaluator = coco._evaluate_in_parts(faster_gt, without_first, None, [[1, 2], [3], [4, 5]])
        evaluator.summarize()
    assert np.array_equal(np.asarray(evaluator.stats[:12]), serial.stats)
    assert np.array_equal(evaluator.eval["precision"], serial.precision)


def _killed_child(category_ids: list[int]) -> dict:
    os._exit(9)  # as a child killed for memory ends: no exception, no result


def test_a_child_that_dies_falls_back_to_one_process_with_one_line(lively_set, monkeypatch, capsys, watchdog) -> None:
    pytest.importorskip("faster_coco_eval", reason="faster-coco-eval is not installed (pip install faster-coco-eval)")
    ground_truth, detections = lively_set
    serial = cocoeval_stats(load_coco(ground_truth), detections, image_ids=None, backend="faster")
    monkeypatch.setattr(coco, "PARALLEL_MIN_DETECTIONS", 0)
    monkeypatch.setattr(coco, "usable_cores", lambda: 2)
    monkeypatch.setattr(coco, "_evaluate_part", _killed_child)
    fallback = cocoeval_stats(load_coco(ground_truth), detections, image_ids=None, backend="faster")
    assert np.array_equal(fallback.stats, serial.stats)
    lines = [line for line in capsys.readouterr().err.splitlines() if "COCO evaluation" in line]
    assert len(lines) == 1 and "evaluating in this one" in lines[0]


def test_missing_faster_coco_eval_falls_back_with_one_line(lively_set, monkeypatch, capsys) -> None:
    ground_truth, detections = lively_set
    monkeypatch.setitem(__import__("sys").modules, "faster_coco_eval", None)  # import faster_coco_eval -> ImportError
    monkeypatch.setattr(coco, "_warned_fallback", False)
    assert coco.resolve_backend("faster") == "pycocotools"
    result = evaluate_coco(load_coco(ground_truth), detections[:500], backend="faster")
    assert result.evaluator.startswith("pycocotools ")
    warnings = [line for line in capsys.readouterr().out.splitlines() if "faster-coco-eval" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning: ")
    with pytest.raises(ValueError, match="--coco-eval"):
        coco.resolve_backend("fast")


@pytest.mark.parametrize("backend", ["pycocotools", "faster"])
def test_a_size_range_without_ground_truth_is_left_out_not_zero(backend: str) -> None:
    """Only large boxes: COCOeval's small and medium APs are -1 (undefined), left out of the metrics (an empty
    cell in results.csv); before they were 0.0 there, as if the model found none of the small objects there are
    none of."""
    ground_truth = synthetic_ground_truth(6, seed=3)
    ground_truth["annotations"] = [ann for ann in ground_truth["annotations"] if ann["area"] > 96**2]
    detections = noisy_detections(ground_truth, per_image=5, seed=4)
    result = evaluate_coco(load_coco(ground_truth), detections, backend=backend)
    assert "mAP_small" not in result.metrics and "mAP_medium" not in result.metrics
    assert 0 < result.metrics["mAP_large"] <= 1 and 0 < result.metrics["mAP50-95"] <= 1


def test_no_detections_scores_zero_and_names_the_evaluator() -> None:
    ground_truth = load_coco(synthetic_ground_truth(4, seed=2))
    result = evaluate_coco(ground_truth, np.zeros((0, 7)), backend="pycocotools")
    assert result.metrics == dict.fromkeys(METRIC_NAMES, 0.0) and result.evaluator.startswith("pycocotools ")


@pytest.mark.parametrize("backend", ["pycocotools", "faster"])
@pytest.mark.parametrize("scored", ["all images", "some"])
def test_no_detections_is_what_cocoeval_gives_for_one_that_finds_nothing(backend: str, scored: str) -> None:
    """Without detections every metric was 0 and every class's AP undefined: results.csv's mAP_large read 0 where the
    split has no large box, and the table's classes "-" beside an "all" row of 0. COCOeval itself, scoring one
    detection that finds nothing (on an image without boxes), gives the limit: AP 0 where there is ground truth to
    find, undefined (left out, NaN) where there is none: no large boxes here, a class of crowd regions alone (not
    ground truth to find), and a class never in the ground truth."""
    data = synthetic_ground_truth(10, seed=5)
    data["annotations"] = [ann for ann in data["annotations"] if ann["area"] <= 96**2]  # no large box
    for ann in data["annotations"]:
        ann["iscrowd"] = int(ann["category_id"] == 2)  # class 2: crowd regions only
    assert {ann["category_id"] for ann in data["annotations"]} == {1, 2, 3, 4}  # class 5 has none
    image_ids = None if scored == "all images" else [1, 2, 3]
    ground_truth = load_coco(data)
    assert not ground_truth.getAnnIds(imgIds=[1])  # the detection's image: nothing to find there
    nothing = np.array([[1, 10.0, 10.0, 50.0, 50.0, 0.5, 1]])
    limit = evaluate_coco(ground_truth, nothing, image_ids=image_ids, backend=backend)
    assert "mAP_large" not in limit.metrics and limit.metrics["mAP_small"] == 0.0  # COCOeval's, as a check
    result = evaluate_coco(ground_truth, np.zeros((0, 7)), image_ids=image_ids, backend=backend)
    assert result.metrics == limit.metrics
    np.testing.assert_array_equal(result.per_class_ap, limit.per_class_ap)  # NaN where NaN
    np.testing.assert_array_equal(result.per_class_ap50, limit.per_class_ap50)
    assert np.isnan(result.per_class_ap[[1, 4]]).all() and (result.per_class_ap[[0, 2, 3]] == 0).all()


def test_to_coco_detections_is_unletterbox_per_box() -> None:
    """The batch-vectorised conversion gives, to the bit, what unletterbox_boxes gives image by image."""
    rng = np.random.default_rng(3)
    metas = [ImageMeta(7, (480, 640), 0.5, (0.0, 40.0)), ImageMeta(9, (300, 200), 320 / 300, (53.0, 0.0)),
             ImageMeta(11, (100, 100), 3.2, (0.0, 0.0))]
    detections = []
    for count in (5, 0, 4):  # an image without detections between two with
        corners = torch.from_numpy(rng.uniform(-20, 340, (count, 2, 2))).float()
        boxes = torch.cat((corners.min(1).values, corners.max(1).values), 1)  # some outside the image: clipped
        detections.append({"boxes": boxes, "scores": torch.rand(count), "labels": torch.randint(0, 3, (count,))})
    rows = to_coco_detections(detections, metas, [10, 20, 30])
    expected = []
    for detection, meta in zip(detections, metas):
        boxes = unletterbox_boxes(detection["boxes"], meta)
        boxes[:, 2:] -= boxes[:, :2]
        for box, score, label in zip(boxes.tolist(), detection["scores"].tolist(), detection["labels"].tolist()):
            expected.append([meta.image_id, *(round(v, 3) for v in box), round(score, 5), [10, 20, 30][label]])
    assert rows.shape == (9, 7) and rows.tolist() == expected
    assert to_coco_detections([detections[1]], [metas[1]], [10, 20, 30]).shape == (0, 7)


def test_results_json_holds_what_was_scored(lively_set, tmp_path: Path) -> None:
    ground_truth, detections = lively_set
    path = tmp_path / "run" / "predictions.json"
    evaluate_coco(load_coco(ground_truth), detections[:300], backend="pycocotools", results_json=path)
    entries = json.loads(path.read_text())
    assert [[e["image_id"], *e["bbox"], e["score"], e["category_id"]] for e in entries] == detections[:300].tolist()
    assert [p.name for p in path.parent.iterdir()] == ["predictions.json"]  # no temporary file left behind
    files = {image["id"]: image["file_name"] for image in ground_truth["images"]}
    assert [e["file_name"] for e in entries] == [files[int(row[0])] for row in detections[:300]]
