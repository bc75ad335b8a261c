"""COCO mAP: ground truth from our records (or the dataset's own JSON), detections as one array, results JSON out.

Two evaluators compute the same numbers: faster-coco-eval (C++ matching and accumulation; the default) and
pycocotools (the reference, ``--coco-eval pycocotools``). :func:`cocoeval_stats` is the one place that knows
which one runs; every result says which one it was (``EvalResult.evaluator``). tests/metrics/test_coco.py holds
faster-coco-eval to pycocotools' numbers. Large sets (COCO val) are evaluated by category in forked processes,
to the same bits (see ``PARALLEL_MIN_DETECTIONS``).

Detections travel as one float64 ``[N, 7]`` array, ``[image_id, x, y, w, h, score, category_id]`` (COCO's xywh in
original-image pixels), the layout both libraries' ``loadNumpyAnnotations`` read: at COCO-val size (5,000
images x 300 detections) a Python dict per box costs seconds before the evaluator starts. Category ids are
1-based class indices for YOLO-label datasets and the JSON's own ids for COCO datasets.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib.metadata
import io
import json
import multiprocessing
import signal
import sys
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval, Params

from detector.choices import COCO_EVAL as BACKENDS
from detector.data.letterbox import ImageMeta, unletterbox_rows
from detector.data.workers import usable_cores
from detector.files import write_atomically

if TYPE_CHECKING:
    from faster_coco_eval import COCO as FasterCOCO

METRIC_NAMES = ("mAP50-95", "mAP50", "mAP75", "mAP_small", "mAP_medium", "mAP_large")


DETECTION_COLUMNS = ("image_id", "x", "y", "w", "h", "score", "category_id")  # to_coco_detections' [N, 7] rows


@dataclass
class EvalResult:
    metrics: dict[str, float]  # METRIC_NAMES -> value in [0, 1]; a size range without ground truth left out
    per_class_ap: np.ndarray  # [C] AP50-95 per class (nan where a class has no ground truth)
    per_class_ap50: np.ndarray  # [C]
    summary: str = ""  # the evaluator's printed table (the 12 "Average Precision / Recall" lines)
    evaluator: str = ""  # which library produced these numbers, with its version: "faster-coco-eval 1.8.0"
    stats: np.ndarray | None = None  # [12] the evaluator's summary numbers (COCOeval.stats); None without detections
    # The val table's "all" P and R of the same pass (detector/metrics/matching.py, mean_precision_recall), where its
    # scoring was asked for them (training's epochs: results.csv's P and R); None otherwise. Not COCO's: matched by
    # whoever scores the pass, beside the evaluator (with_precision_recall), in the background worker too.
    mean_precision: float | None = None
    mean_recall: float | None = None


def to_coco_detections(
    detections: list[dict[str, torch.Tensor]], metas: list[ImageMeta], category_ids: list[int]
) -> np.ndarray:
    """One batch's detections -> float64 ``[N, 7]`` rows ``[image_id, x, y, w, h, score, category_id]``.

    The letterbox is undone and the boxes clipped to the original image (xywh pixels, rounded to 3 decimals;
    scores to 5, as the results JSON stores them, so what is scored is what is written). One vectorised pass
    over the batch: no Python object per box.
    """
    counts = [len(detection["scores"]) for detection in detections]
    if not sum(counts):
        return np.zeros((0, len(DETECTION_COLUMNS)))
    boxes = torch.cat([d["boxes"].detach().reshape(-1, 4) for d in detections])
    boxes = unletterbox_rows(boxes, metas, counts).numpy()  # the letterbox undone for the whole batch at once
    scores = torch.cat([d["scores"].detach() for d in detections]).float().cpu().numpy()
    labels = torch.cat([d["labels"].detach() for d in detections]).cpu().numpy()
    image_of_box = np.repeat(np.arange(len(metas)), counts)
    boxes[:, 2:] -= boxes[:, :2]  # xyxy -> COCO's xywh
    rows = np.empty((len(scores), len(DETECTION_COLUMNS)))
    rows[:, 0] = np.array([meta.image_id for meta in metas], np.float64)[image_of_box]
    rows[:, 1:5] = np.round(boxes.astype(np.float64), 3)
    rows[:, 5] = np.round(scores.astype(np.float64), 5)
    rows[:, 6] = np.asarray(category_ids, np.float64)[labels]
    return rows


# COCOeval reads at most this many detections of each (image, category): its best by score, equal scores in the
# results' order (a stable sort), cut before any matching (evaluateImg), so the rest can never change a number.
SCORED_PER_IMAGE_CLASS = max(Params(iouType="bbox").maxDets)  # 100


def scored_detections(detections: np.ndarray, per_group: int = SCORED_PER_IMAGE_CLASS) -> np.ndarray:
    """The ``[N, 7]`` rows COCOeval reads: each (image, category)'s best ``per_group`` by score, equal scores in
    row order, the rows kept in their own order (so each group's are as COCOeval would list them).

    At conf 0.001 and ``--max-det 300`` most images have 300 detections, and with few classes most of them lie
    past a class's 100th: 63% of a BCCD-trained nano's on BCCD val (3 classes), whose faster-coco-eval pass then
    took 90 ms against 160 ms (2-core EPYC; the same 12 numbers to the bit: tests/metrics/test_coco.py).
    """
    if len(detections) <= per_group:
        return detections
    # By image, then category, then score descending; lexsort is stable, so equal scores stay in row order.
    order = np.lexsort((-detections[:, 5], detections[:, 6], detections[:, 0]))
    grouped = detections[order][:, [0, 6]]
    starts = np.flatnonzero(np.r_[True, (grouped[1:] != grouped[:-1]).any(1)])
    rank = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))  # place within its group
    return detections[np.sort(order[rank < per_group])]


# --------------------------------------------------------------------------------------------- evaluators
_warned_fallback = False


def faster_coco_eval_available() -> bool:
    try:
        import faster_coco_eval  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_backend(requested: str) -> str:
    """``requested`` (a BACKENDS name) if it can run here: ``faster`` without faster-coco-eval installed falls
    back to ``pycocotools``, saying so in one line (once per process)."""
    global _warned_fallback
    if requested not in BACKENDS:
        raise ValueError(f"--coco-eval must be one of {', '.join(BACKENDS)} (got {requested!r})")
    if requested == "faster" and not faster_coco_eval_available():
        if not _warned_fallback:
            print("warning: faster-coco-eval is not installed (pip install faster-coco-eval): "
                  "evaluating with pycocotools, ~5x slower at COCO-val size")
            _warned_fallback = True
        return "pycocotools"
    return requested


def evaluator_name(backend: str) -> str:
    """The library that ``backend`` runs and its version, e.g. ``faster-coco-eval 1.8.0``: what results name."""
    package = "faster-coco-eval" if resolve_backend(backend) == "faster" else "pycocotools"
    return f"{package} {installed_version(package)}"


@functools.cache
def installed_version(package: str) -> str:
    """``importlib.metadata.version``, read once: it scans the installed distributions (~2 ms), and a 30-epoch run
    asked ~60 times (0.12 s)."""
    return importlib.metadata.version(package)


def results_annotations(detections: np.ndarray) -> list[dict]:
    """``[N, 7]`` rows -> the annotations ``COCO.loadRes`` builds from a bbox result list (ids from 1, area
    ``w * h``, not crowd), minus the box-outline polygon it adds that bbox evaluation never reads.

    Built from ``tolist()`` columns in one pass: ``loadRes`` of the array itself (``loadNumpyAnnotations``)
    reads it element by element, and then walks the list again to add these fields.
    """
    image_ids = detections[:, 0].astype(np.int64).tolist()
    category_ids = detections[:, 6].astype(np.int64).tolist()
    boxes = detections[:, 1:5].tolist()
    scores = detections[:, 5].tolist()
    return [
        {"id": index, "image_id": image_id, "category_id": category_id, "bbox": box, "score": score,
         "area": box[2] * box[3], "iscrowd": 0}
        for index, image_id, category_id, box, score in zip(range(1, len(scores) + 1), image_ids, category_ids,
                                                             boxes, scores)
    ]


@dataclass
class CocoEvalOutput:
    stats: np.ndarray  # [12] COCOeval.stats: AP 50-95, 50, 75, small, medium, large; AR 1, 10, 100, small, ...
    precision: np.ndarray  # [IoU thresholds 10, recall points 101, classes K, areas 4, max-dets 3]; -1 = undefined
    summary: str  # the 12 printed "Average Precision / Recall" lines
    evaluator: str  # evaluator_name(backend)


def cocoeval_stats(
    ground_truth: COCO, detections: np.ndarray, *, image_ids: list[int] | None, backend: str, processes: bool = True
) -> CocoEvalOutput:
    """Bbox COCOeval (evaluate, accumulate, summarize) of ``[N >= 1, 7]`` detections with one of BACKENDS.

    The one place that knows which library runs. ``image_ids``: the images to score (default: every
    ground-truth image). faster-coco-eval evaluates large sets by category in forked processes
    (:func:`_evaluate_in_parts`) unless ``processes`` is False; pycocotools always runs as it is, in this process.
    """
    backend = resolve_backend(backend)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), _no_garbage_collection():
        if backend == "faster":
            ground_truth = _as_faster_coco(ground_truth)
        parts = _category_parts(ground_truth, detections) if backend == "faster" and processes else []
        if len(parts) > 1:
            evaluator = _evaluate_in_parts(ground_truth, detections, image_ids, parts)
        else:
            evaluator = _evaluate(ground_truth, detections, image_ids, None, backend)
        evaluator.summarize()
    # pycocotools prints the 12 lines of COCOeval.stats; faster-coco-eval adds AR at IoU 0.50 and 0.75 after them
    summary = "\n".join([line for line in printed.getvalue().splitlines() if line.startswith(" Average")][:12])
    return CocoEvalOutput(np.asarray(evaluator.stats[:12], np.float64), np.asarray(evaluator.eval["precision"]),
                          summary, evaluator_name(backend))


def _evaluate(ground_truth, detections: np.ndarray, image_ids: list[int] | None, category_ids: list[int] | None,
              backend: str):
    """The library's evaluator after evaluate() and accumulate() (summarize() is the caller's): over every
    category, or over ``category_ids`` only (``detections`` then holds just theirs)."""
    if backend == "faster":
        from faster_coco_eval import COCOeval_faster as Evaluator
    else:
        Evaluator = COCOeval
    results = type(ground_truth)()  # the library's own COCO class, as its loadRes would make
    results.dataset = {"images": ground_truth.dataset["images"], "categories": ground_truth.dataset["categories"],
                       "annotations": results_annotations(detections)}
    results.createIndex()
    # faster-coco-eval logs through print_function (default: the logging module); print keeps both alike
    options = {"print_function": print} if backend == "faster" else {}
    evaluator = Evaluator(ground_truth, results, "bbox", **options)
    if image_ids is not None:  # images skipped as unreadable must not count as misses
        evaluator.params.imgIds = sorted(image_ids)
    if category_ids is not None:
        evaluator.params.catIds = category_ids
    evaluator.evaluate()
    evaluator.accumulate()
    return evaluator


# Evaluation by category in forked processes. COCO scores each category from its own detections and ground
# truth alone (matching, precision, recall), so the accumulated arrays of consecutive category ranges,
# concatenated along the class axis, are the one-process arrays exactly, and summarize() averages them in the
# same order: the same 12 numbers to the bit (tests/metrics/test_coco.py). Each child builds the result dicts
# of its own categories from the array; building them here and forking after cost more than it saved (the
# children's reference counting copied the parent's pages of 1.5M dicts: 9.3 s against 7.7 s serial).
PARALLEL_MIN_DETECTIONS = 200_000  # below this a fork costs more than it saves (COCO val x 300 is 1.5M)
MAX_PARTS = 8
_forked_job: tuple | None = None  # (ground truth, detections, image ids): what the forked children read


def _category_parts(ground_truth, detections: np.ndarray) -> list[list[int]]:
    """Consecutive ranges of the sorted category ids, about equal in detections; one range (no fork) for small
    sets, single-core machines and platforms without fork."""
    category_ids = sorted(ground_truth.getCatIds())
    parts = min(usable_cores(), MAX_PARTS, len(category_ids))
    if (parts < 2 or len(detections) < PARALLEL_MIN_DETECTIONS
            or "fork" not in multiprocessing.get_all_start_methods()):
        return [category_ids]
    # one pass over the detections (their ids are the ground truth's), not one per category
    counts = np.bincount(np.searchsorted(category_ids, detections[:, 6]), minlength=len(category_ids))
    counts = counts[: len(category_ids)]
    cuts = np.searchsorted(np.cumsum(counts), counts.sum() * np.arange(1, parts) / parts)
    ranges = np.split(np.array(category_ids), np.unique(np.clip(cuts + 1, 1, len(category_ids) - 1)))
    return [part.tolist() for part in ranges if len(part)]


def _evaluate_part(category_ids: list[int]) -> dict[str, np.ndarray]:
    """In a forked child: the accumulated arrays of ``category_ids``."""
    ground_truth, detections, image_ids = _forked_job
    mine = detections[np.isin(detections[:, 6], category_ids)]
    with contextlib.redirect_stdout(io.StringIO()), _no_garbage_collection():
        evaluator = _evaluate(ground_truth, mine, image_ids, category_ids, "faster")
    return {key: evaluator.eval[key] for key in ("precision", "recall", "scores")}


def _evaluate_in_parts(ground_truth, detections: np.ndarray, image_ids: list[int] | None,
                       parts: list[list[int]]):
    """A faster-coco-eval evaluator over every category, ready for summarize(), its arrays computed by
    category range in forked processes."""
    from faster_coco_eval import COCOeval_faster

    global _forked_job
    _forked_job = (ground_truth, detections, image_ids)
    try:
        # The children ignore SIGINT, as loader workers do: the trainer's Ctrl-C handler decides, once. A
        # child that dies (killed for memory) breaks the pool instead of hanging it: evaluate here instead.
        with ProcessPoolExecutor(len(parts), mp_context=multiprocessing.get_context("fork"),
                                 initializer=signal.signal, initargs=(signal.SIGINT, signal.SIG_IGN)) as pool:
            arrays = list(pool.map(_evaluate_part, parts))
    except BrokenProcessPool as error:
        print(f"warning: COCO evaluation in {len(parts)} processes failed ({error}); evaluating in this one",
              file=sys.stderr)
        return _evaluate(ground_truth, detections, image_ids, None, "faster")
    finally:
        _forked_job = None
    evaluator = COCOeval_faster(ground_truth, None, "bbox", print_function=print)
    if image_ids is not None:
        evaluator.params.imgIds = sorted(image_ids)
    # class axis: precision [T, R, K, A, M], recall [T, K, A, M], scores [T, R, K, A, M]
    evaluator.eval = {"precision": np.concatenate([a["precision"] for a in arrays], axis=2),
                      "recall": np.concatenate([a["recall"] for a in arrays], axis=1),
                      "scores": np.concatenate([a["scores"] for a in arrays], axis=2)}
    return evaluator


@contextlib.contextmanager
def _no_garbage_collection() -> Iterator[None]:
    """Both evaluators hold a dict and lists per detection (1.5M at COCO-val size) until they finish; every
    full collection would walk them all, and the allocations trigger many (measured at 5000 images x 300
    detections: 17 s of CPU with the collector on, 14 s off)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _as_faster_coco(ground_truth: COCO) -> FasterCOCO:
    """The same ground truth (the same annotation dicts, no copy) indexed by faster-coco-eval's own COCO class."""
    from faster_coco_eval import COCO as FasterCOCO

    with contextlib.redirect_stdout(io.StringIO()):
        coco = FasterCOCO()
        coco.dataset = ground_truth.dataset
        coco.createIndex()
    return coco


RESULT_JSON_ENTRY = '{"image_id": %d, "category_id": %d, "bbox": [%.3f, %.3f, %.3f, %.3f], "score": %.5f}'
NAMED_RESULT_JSON_ENTRY = RESULT_JSON_ENTRY.replace(', "category_id"', ', "file_name": %s, "category_id"')


def write_results_json(path: Path, detections: np.ndarray, ground_truth: COCO | None = None) -> None:
    """COCO results JSON (a list of ``{image_id, category_id, bbox, score}``), written atomically. With
    ``ground_truth``, each entry also names its image's ``file_name`` (the ground truth's, as Ultralytics writes it):
    a YOLO dataset's image ids are positions in its sorted file list where its file names are not all numbers.

    Formatted row by row with ``%``: a third of the time of dicts through json.dumps (1.5M rows: ~2.5 s
    against ~6-9 s of CPU, measured). Exact: the boxes and scores were rounded to 3 and 5 decimals
    (to_coco_detections), so ``%.3f`` / ``%.5f`` print those decimals, which parse back to the same doubles.
    """
    columns = detections[:, [0, 6, 1, 2, 3, 4, 5]].tolist()  # RESULT_JSON_ENTRY's order
    with _no_garbage_collection():
        if ground_truth is None:
            rows = map(RESULT_JSON_ENTRY.__mod__, map(tuple, columns))
        else:  # each name quoted once, as JSON strings
            names = {image_id: json.dumps(image["file_name"]) for image_id, image in ground_truth.imgs.items()
                     if "file_name" in image}
            rows = (NAMED_RESULT_JSON_ENTRY % (row[0], names.get(int(row[0]), "null"), *row[1:]) for row in columns)
        text = "[\n" + ",\n".join(rows) + "\n]\n"
    write_atomically(path, text.encode())


def _without_detections(ground_truth: COCO, image_ids: list[int] | None) -> tuple[dict[str, float], np.ndarray]:
    """The metrics and per-class AP that COCOeval gives as its detections go to none, for a pass without any: an AP is
    0 where there is ground truth to find and undefined where there is none, as with detections. Before, every metric
    was 0 (results.csv's mAP_large too where the split has no large box) and every class's AP undefined (the table's
    "-" beside an "all" row of 0). What COCOeval counts: the scored images' boxes that are not crowd regions, by
    category (``getCatIds``' order, the per-class arrays') and by its own area ranges, bounds included."""
    params = Params(iouType="bbox")
    images = set(ground_truth.getImgIds() if image_ids is None else image_ids)
    boxes = [(ann["category_id"], ann["area"]) for ann in ground_truth.dataset["annotations"]
             if ann["image_id"] in images and not ann.get("iscrowd", 0)]
    metrics = dict.fromkeys(METRIC_NAMES[:3], 0.0)  # the overall ones stay numbers, as with detections
    for name, (low, high) in zip(METRIC_NAMES[3:], params.areaRng[1:]):  # small, medium, large
        if any(low <= area <= high for _, area in boxes):
            metrics[name] = 0.0
    found = {category for category, area in boxes if area <= params.areaRng[0][1]}  # "all": [0, 1e10]
    per_class = np.array([0.0 if category in found else np.nan for category in sorted(ground_truth.getCatIds())])
    return metrics, per_class


def evaluate_coco(
    ground_truth: COCO,
    detections: np.ndarray,
    *,
    image_ids: list[int] | None = None,
    results_json: Path | None = None,
    backend: str = "faster",
    processes: bool = True,
) -> EvalResult:
    """Score ``[N, 7]`` detections (:func:`to_coco_detections` rows) over ``image_ids`` (default: every
    ground-truth image) with ``backend``; optionally write the results JSON. ``processes=False``: never fork
    (:func:`cocoeval_stats`)."""
    num_classes = len(ground_truth.getCatIds())
    detections = np.asarray(detections, np.float64).reshape(-1, len(DETECTION_COLUMNS))
    if results_json is not None:
        write_results_json(results_json, detections, ground_truth)
    evaluator = evaluator_name(backend)
    if not len(detections):  # pycocotools cannot load an empty result list
        metrics, per_class = _without_detections(ground_truth, image_ids)
        return EvalResult(metrics, per_class, per_class.copy(), "no detections", evaluator)
    # The results JSON above holds every detection; the evaluator gets only those it would read.
    output = cocoeval_stats(ground_truth, scored_detections(detections), image_ids=image_ids, backend=backend,
                            processes=processes)
    # COCOeval's -1 is "undefined": no ground truth of that kind. A size-range AP is then left out (an empty cell
    # in results.csv, skipped by its plot; 0.0 read as a model that finds no small objects where there are none;
    # NaN would make two equal results compare unequal); the overall ones stay numbers, which best.pt's choice
    # compares.
    metrics = {name: float(max(value, 0.0)) for index, (name, value) in enumerate(zip(METRIC_NAMES, output.stats[:6]))
               if index < 3 or value > -1}
    precision = output.precision[:, :, :, 0, -1]  # [IoU thresholds, recall, classes], all areas, 100 dets
    per_class = np.full(num_classes, np.nan)
    per_class50 = np.full(num_classes, np.nan)
    for k in range(precision.shape[2]):
        valid = precision[:, :, k] > -1
        if valid.any():
            per_class[k] = precision[:, :, k][valid].mean()
            valid50 = precision[0, :, k] > -1
            per_class50[k] = precision[0, :, k][valid50].mean() if valid50.any() else np.nan
    return EvalResult(metrics, per_class, per_class50, output.summary, output.evaluator, output.stats)
