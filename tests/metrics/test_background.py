"""BackgroundScorer: a forked worker scores a pass to the in-process evaluation's bits, and survives what a run
throws at it (a Ctrl-C to the process group, a worker that dies or hangs, an error that stops the run, a trainer
killed outright)."""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from detector.data.ground_truth import load_coco
from detector import forked
from detector.metrics import background
from detector.metrics.background import BackgroundScorer
from detector.metrics.coco import evaluate_coco
from tests.metrics.test_coco import noisy_detections, synthetic_ground_truth

pytestmark = pytest.mark.skipif(not forked.fork_available(), reason="this platform cannot fork")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def scored_set() -> tuple[dict, np.ndarray, list[int]]:
    ground_truth = synthetic_ground_truth(20, seed=2)
    image_ids = [image["id"] for image in ground_truth["images"]][2:]  # a subset, as when images were unreadable
    return ground_truth, noisy_detections(ground_truth, per_image=120, seed=3), image_ids


def _same(a, b) -> bool:
    return (a.metrics == b.metrics and a.summary == b.summary and a.evaluator == b.evaluator
            and np.array_equal(a.per_class_ap, b.per_class_ap, equal_nan=True)
            and np.array_equal(a.stats, b.stats))


def _workers(before: set) -> set:
    return set(multiprocessing.active_children()) - before


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
            with pytest.raises(RuntimeError, match="one pass at a time"):
                scorer.submit(rows, image_ids)
            inline = evaluate_coco(coco, rows, image_ids=image_ids, backend=backend)
            assert _same(pending.result(), inline) and inline.metrics["mAP50"] > 0.2
        (worker,) = _workers(children)
        assert worker.pid != os.getpid() and worker.daemon
    finally:
        scorer.close()
        scorer.close()  # idempotent
    assert not _workers(children) and not scorer.failed


def test_a_ctrl_c_to_the_process_group_leaves_the_worker_scoring(scored_set, watchdog) -> None:
    """Ctrl-C reaches every process of the terminal's group: the worker ignores it (the trainer decides)."""
    ground_truth, detections, image_ids = scored_set
    coco = load_coco(ground_truth)
    children = set(multiprocessing.active_children())
    scorer = BackgroundScorer(coco, backend="pycocotools")
    try:
        first = scorer.submit(detections, image_ids).result()
        (worker,) = _workers(children)
        os.kill(worker.pid, signal.SIGINT)
        assert _same(scorer.submit(detections, image_ids).result(), first) and worker.is_alive()
    finally:
        scorer.close()


def _dies_mid_pass(handle, jobs, parents_end, parent) -> None:
    jobs.recv()
    os._exit(9)  # as a worker killed for memory ends: no exception, no answer


def _hangs(handle, jobs, parents_end, parent) -> None:
    jobs.recv()
    time.sleep(60)


@pytest.mark.parametrize("worker", [_dies_mid_pass, _hangs])
def test_a_worker_that_dies_or_hangs_costs_one_line_and_no_scores(
        worker, scored_set, monkeypatch, capsys, watchdog) -> None:
    ground_truth, detections, image_ids = scored_set
    coco = load_coco(ground_truth)
    inline = evaluate_coco(coco, detections, image_ids=image_ids, backend="pycocotools")
    monkeypatch.setattr(forked, "_serve", worker)  # what the next fork runs
    children = set(multiprocessing.active_children())
    scorer = BackgroundScorer(coco, backend="pycocotools", timeout=1.0)
    started = time.monotonic()
    assert _same(scorer.submit(detections, image_ids).result(), inline)
    assert time.monotonic() - started < 15  # the hung worker was given up after the timeout, and killed at once
    assert scorer.failed and not _workers(children)
    assert _same(scorer.submit(detections, image_ids).result(), inline)  # the rest: scored here, no new fork
    assert not _workers(children)
    lines = [line for line in capsys.readouterr().err.splitlines() if "background" in line]
    assert len(lines) == 1 and lines[0].startswith("warning: COCO scoring in the background failed")


def test_a_pass_that_fails_in_the_worker_costs_one_line_and_is_scored_here(scored_set, monkeypatch, capsys,
                                                                           watchdog) -> None:
    """The worker answers with the error (the helper is alive): the run scores that pass and the rest itself."""
    ground_truth, detections, image_ids = scored_set
    coco = load_coco(ground_truth)
    inline = evaluate_coco(coco, detections, image_ids=image_ids, backend="pycocotools")
    parent, real = os.getpid(), background.evaluate_coco

    def fails_in_the_child(*args, **kwargs):
        if os.getpid() != parent:
            raise MemoryError("no room for the pass")
        return real(*args, **kwargs)

    monkeypatch.setattr(background, "evaluate_coco", fails_in_the_child)
    children = set(multiprocessing.active_children())
    scorer = BackgroundScorer(coco, backend="pycocotools")
    assert _same(scorer.submit(detections, image_ids).result(), inline)
    assert scorer.failed and not _workers(children)
    assert _same(scorer.submit(detections, image_ids).result(), inline)
    lines = [line for line in capsys.readouterr().err.splitlines() if "background" in line]
    assert len(lines) == 1 and "MemoryError: no room for the pass" in lines[0]


def test_a_run_stopped_by_an_error_does_not_wait_for_the_pass(scored_set, monkeypatch, watchdog) -> None:
    ground_truth, detections, image_ids = scored_set
    monkeypatch.setattr(forked, "_serve", _hangs)
    children = set(multiprocessing.active_children())
    scorer = BackgroundScorer(load_coco(ground_truth), backend="pycocotools")
    scorer.submit(detections, image_ids)  # never read: the run stopped
    started = time.monotonic()
    scorer.close()
    assert time.monotonic() - started < 5 and not _workers(children)


class _Owned:
    """Stands for an object of the trainer whose finalizer must run in the trainer only (a CUDA tensor's)."""

    log: Path

    def __del__(self) -> None:
        with self.log.open("a") as file:
            file.write(f"{os.getpid()}\n")


def test_the_worker_runs_none_of_its_parents_finalizers(scored_set, tmp_path: Path, watchdog) -> None:
    ground_truth, detections, image_ids = scored_set
    _Owned.log = tmp_path / "finalized"
    _Owned.log.touch()
    scorer = BackgroundScorer(load_coco(ground_truth), backend="pycocotools")
    gc.collect()
    for _ in range(50):  # garbage cycles the collector has not reached yet...
        owned = _Owned()
        owned.me = owned
    del owned
    near = [[] for _ in range(max(0, gc.get_threshold()[0] - gc.get_count()[0] - 100))]  # ...and it nearly will
    try:
        scorer.submit(detections[:100], image_ids).result()
    finally:
        scorer.close()
    del near
    gc.collect()
    finalized = _Owned.log.read_text().split()
    assert finalized == [str(os.getpid())] * 50  # each once, here


def test_a_fork_that_fails_costs_one_line_and_scores_here(scored_set, monkeypatch, capsys) -> None:
    ground_truth, detections, image_ids = scored_set
    coco = load_coco(ground_truth)

    def refused(self) -> None:
        raise AssertionError("daemonic processes are not allowed to have children")  # multiprocessing's words

    monkeypatch.setattr(multiprocessing.get_context("fork").Process, "start", refused)
    scorer = BackgroundScorer(coco, backend="pycocotools")
    inline = evaluate_coco(coco, detections, image_ids=image_ids, backend="pycocotools")
    assert _same(scorer.submit(detections, image_ids).result(), inline) and scorer.failed
    assert _same(scorer.submit(detections, image_ids).result(), inline)
    lines = [line for line in capsys.readouterr().err.splitlines() if "background" in line]
    assert len(lines) == 1 and "not allowed to have children" in lines[0]


def _availability(answers) -> None:
    answers.put(forked.fork_available())


def test_a_daemonic_process_scores_inline(watchdog) -> None:
    """A training run inside a multiprocessing pool's worker (daemonic) may not fork: auto keeps it inline."""
    context = multiprocessing.get_context("fork")
    answers = context.Queue()
    process = context.Process(target=_availability, args=(answers,), daemon=True)
    process.start()
    assert answers.get(timeout=60) is False and forked.fork_available()
    process.join(60)


KILLED_TRAINER = """
import os, time, numpy as np
from detector.data.ground_truth import load_coco
from detector import forked
from detector.metrics import background
from tests.metrics.test_coco import synthetic_ground_truth
background.evaluate_coco = lambda *args, **kwargs: time.sleep(600)  # a long pass: the worker is not reading its pipe
scorer = background.BackgroundScorer(load_coco(synthetic_ground_truth(4, seed=0)), backend="pycocotools")
scorer.submit(np.zeros((0, 7)), None)
time.sleep(1)  # the worker is in its pass
print(scorer.helper._process.pid, flush=True)
os.kill(os.getpid(), 9)  # as the OOM killer or a second SIGTERM ends a trainer: no finally, no atexit
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_the_worker_dies_with_a_trainer_killed_outright(watchdog) -> None:
    done = subprocess.run([sys.executable, "-c", KILLED_TRAINER], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    worker = int(done.stdout.split()[-1])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(worker):
        time.sleep(0.1)
    orphaned = _alive(worker)
    if orphaned:
        os.kill(worker, signal.SIGKILL)  # the test fails; the machine keeps no orphan
    assert not orphaned


def _alive(pid: int) -> bool:
    """A process that still runs (a zombie awaiting its reaper counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_the_worker_scores_p_and_r_to_the_bit_of_this_process(tiny_split, watchdog) -> None:
    """A training pass scored in the background sends its prediction rows with its detections: the worker matches
    them against the split it inherited, to the bit of the same pass scored inline (mAP, P and R)."""
    from detector.metrics.loop import Scoring, make_val_loader, run_validation
    from detector.metrics.matching import prediction_rows
    from tests.metrics.test_matching import noisy_predictions

    predictions = noisy_predictions(tiny_split)
    batches = list(make_val_loader(tiny_split, batch_size=4, workers=0, rect=False))  # one batch: the 4 images

    def infer(images):
        return [detection for detection, _ in predictions]

    inline = run_validation(infer, tiny_split, batches, progress=False,
                            scoring=Scoring("pycocotools", precision_recall=True)).result
    children = set(multiprocessing.active_children())
    scorer = BackgroundScorer(tiny_split.ground_truth, backend="pycocotools", split=tiny_split)
    try:
        validation = run_validation(infer, tiny_split, batches, progress=False,
                                    scoring=Scoring("pycocotools", scorer, precision_recall=True))
        assert validation.in_background
        result = validation.result
        assert len(_workers(children)) == 1 and not scorer.failed  # scored in the worker, not inline after a failure
    finally:
        scorer.close()
    assert _same(result, inline) and 0 < inline.mean_precision < 1 and 0 < inline.mean_recall <= 1
    assert (result.mean_precision, result.mean_recall) == (inline.mean_precision, inline.mean_recall)
    unmatched = BackgroundScorer(tiny_split.ground_truth, backend="pycocotools")  # no split: nothing to match against
    with pytest.raises(ValueError, match="need the split"):
        unmatched.submit(validation.detections, None, prediction_rows(predictions))
