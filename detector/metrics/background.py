"""COCO scoring in a process of its own, so that a run's next epoch trains while the last validation is scored.

On a GPU a short epoch's training and the COCO evaluation of its validation take the same order of time, and the
evaluation is all host work that the GPU waits for: BCCD on an H200, 0.16 s of training an epoch against ~0.13 s of
COCO results and evaluation a pass (docs/gpu.md). :class:`BackgroundScorer` hands a pass's detections to one worker
process and returns at once with a :class:`PendingScore`, which the trainer reads when it needs the numbers
(detector/training/trainer.py: at the next epoch's end, or at once where the run may stop).

A process, not a thread: faster-coco-eval prepares its input in Python (~60% of its time) under the GIL. Measured on
a 2-core AMD EPYC: a pure-Python loop beside an evaluation thread ran at 0.69 of its speed alone, and the evaluation
took 2.4x as long. The worker is forked, once, at the first pass it scores: it inherits the ground truth (COCO
val's is ~0.5 GB of dicts) instead of receiving it, and each pass sends only the ``[N, 7]`` detections array
(BCCD's 87 images x 300: 1.5 MB). It runs numpy and the evaluator only, never CUDA (a forked child of a CUDA
process must not), and ignores SIGINT, as the loader's workers do: the trainer's Ctrl-C handler decides, once.
Where the worker dies (killed for memory), the pass is scored in this process instead, after one warning line.
The numbers are the in-process evaluation's to the bit: the same function on the same arrays
(tests/metrics/test_background.py).
"""

from __future__ import annotations

import multiprocessing
import signal
import sys
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import numpy as np
from pycocotools.coco import COCO

from detector.metrics.coco import EvalResult, evaluate_coco, resolve_backend

# What the forked worker scores against: set in the parent just before the fork, read in the child.
_forked_ground_truth: COCO | None = None


def background_available() -> bool:
    """Whether this platform can fork a worker (Linux; not Windows, where only spawn exists)."""
    return "fork" in multiprocessing.get_all_start_methods()


def _score(detections: np.ndarray, image_ids: list[int] | None, backend: str) -> EvalResult:
    """In the worker: :func:`evaluate_coco` against the inherited ground truth."""
    assert _forked_ground_truth is not None, "the scoring worker was forked without its ground truth"
    return evaluate_coco(_forked_ground_truth, detections, image_ids=image_ids, backend=backend)


class PendingScore:
    """One pass's COCO scores, being computed by the worker: :meth:`result` waits for them (or computes them in
    this process if the worker died)."""

    def __init__(self, future: Future, inline: Callable[[], EvalResult]) -> None:
        self._future, self._inline = future, inline
        self._result: EvalResult | None = None

    def done(self) -> bool:
        return self._result is not None or self._future.done()

    def result(self) -> EvalResult:
        if self._result is None:
            try:
                self._result = self._future.result()
            except BrokenProcessPool as error:
                print(f"warning: COCO scoring in the background failed ({error}); scoring in this process",
                      file=sys.stderr)
                self._result = self._inline()
        return self._result


class BackgroundScorer:
    """Scores validation passes against ``ground_truth`` in one forked worker (see the module docstring).

    Args:
        ground_truth: the split's COCO ground truth; the worker keeps the one it was forked with.
        backend: a :data:`detector.choices.COCO_EVAL` name, resolved here (its fallback line printed in this
            process, not the worker's).
    """

    def __init__(self, ground_truth: COCO, *, backend: str) -> None:
        self.ground_truth, self.backend = ground_truth, resolve_backend(backend)
        self._pool: ProcessPoolExecutor | None = None

    def submit(self, detections: np.ndarray, image_ids: list[int] | None) -> PendingScore:
        """Start scoring ``detections`` (:func:`~detector.metrics.coco.to_coco_detections` rows) over
        ``image_ids``; returns at once."""

        def inline() -> EvalResult:
            return evaluate_coco(self.ground_truth, detections, image_ids=image_ids, backend=self.backend)

        try:
            future = self._worker().submit(_score, detections, image_ids, self.backend)
        except BrokenProcessPool:  # it died scoring an earlier pass: that pass's result() said so
            self.close()
            future = Future()
            future.set_result(inline())
        return PendingScore(future, inline)

    def _worker(self) -> ProcessPoolExecutor:
        global _forked_ground_truth
        if self._pool is None:
            _forked_ground_truth = self.ground_truth  # the fork happens at the pool's first submit
            self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork"),
                                             initializer=signal.signal, initargs=(signal.SIGINT, signal.SIG_IGN))
        return self._pool

    def close(self) -> None:
        """Stop the worker (after the pass it is scoring); a later :meth:`submit` forks a new one. Idempotent."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            pool.shutdown(wait=True, cancel_futures=True)
