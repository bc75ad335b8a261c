"""BackgroundScorer: a forked worker scores a pass to the in-process evaluation's bits, and survives what a run
throws at it (a Ctrl-C to the process group, a worker killed for memory)."""

from __future__ import annotations

import multiprocessing
import os
import signal

import numpy as np
import pytest

from detector.data.ground_truth import load_coco
from detector.metrics import background
from detector.metrics.background import BackgroundScorer
from detector.metrics.coco import evaluate_coco
from tests.metrics.test_coco import noisy_detections, synthetic_ground_truth

pytestmark = pytest.mark.skipif(not background.background_available(), reason="this platform cannot fork")


@pytest.fixture(scope="module")
def scored_set() -> tuple[dict, np.ndarray, list[int]]:
    ground_truth = synthetic_ground_truth(20, seed=2)
    image_ids = [image["id"] for image in ground_truth["images"]][2:]  # a subset, as when images were unreadable
    return ground_truth, noisy_detections(ground_truth, per_image=120, seed=3), image_ids


def _same(a, b) -> bool:
    return (a.metrics == b.metrics and a.summary == b.summary and a.evaluator == b.evaluator
            and np.array_equal(a.per_class_ap, b.per_class_ap, equal_nan=True)
            and np.array_equal(a.stats, b.stats))


@pytest.mark.parametrize("backend", ["faster", "pycocotools"])
def test_the_worker_scores_to_the_bit_of_this_process_and_is_one_process_for_the_run(
        backend, scored_set, watchdog) -> None:
    if backend == "faster":
        pytest.importorskip("faster_coco_eval", reason="faster-coco-eval is not installed")
    ground_truth, detections, image_ids = scored_set
    coco = load_coco(ground_truth)
    children = set(multiprocessing.active_children())
    scorer = BackgroundScorer(coco, backend=backend)
    try:
        for rows in (detections, detections[::2]):  # two passes, one worker
            pending = scorer.submit(rows, image_ids)
            inline = evaluate_coco(coco, rows, image_ids=image_ids, backend=backend)
            assert _same(pending.result(), inline) and pending.done() and inline.metrics["mAP50"] > 0.2
        workers = set(multiprocessing.active_children()) - children
        assert len(workers) == 1 and os.getpid() not in {worker.pid for worker in workers}
    finally:
        scorer.close()
        scorer.close()  # idempotent
    assert set(multiprocessing.active_children()) <= children


def test_a_ctrl_c_to_the_process_group_leaves_the_worker_scoring(scored_set, watchdog) -> None:
    """Ctrl-C reaches every process of the terminal's group: the worker ignores it (the trainer decides)."""
    ground_truth, detections, image_ids = scored_set
    coco = load_coco(ground_truth)
    children = set(multiprocessing.active_children())
    scorer = BackgroundScorer(coco, backend="pycocotools")
    try:
        first = scorer.submit(detections, image_ids).result()
        (worker,) = set(multiprocessing.active_children()) - children
        os.kill(worker.pid, signal.SIGINT)
        assert _same(scorer.submit(detections, image_ids).result(), first) and worker.is_alive()
    finally:
        scorer.close()


def _killed(detections, image_ids, backend):
    os._exit(9)  # as a worker killed for memory ends: no exception, no result


def test_a_worker_that_dies_costs_one_line_and_no_scores(scored_set, monkeypatch, capsys, watchdog) -> None:
    ground_truth, detections, image_ids = scored_set
    coco = load_coco(ground_truth)
    inline = evaluate_coco(coco, detections, image_ids=image_ids, backend="pycocotools")
    monkeypatch.setattr(background, "_score", _killed)  # before the fork: the worker runs it
    scorer = BackgroundScorer(coco, backend="pycocotools")
    try:
        assert _same(scorer.submit(detections, image_ids).result(), inline)
        assert _same(scorer.submit(detections, image_ids).result(), inline)  # the next pass: scored here at once
    finally:
        scorer.close()
    lines = [line for line in capsys.readouterr().err.splitlines() if "background" in line]
    assert len(lines) == 1 and lines[0].startswith("warning: COCO scoring in the background failed")
