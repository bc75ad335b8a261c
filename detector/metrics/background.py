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
(BCCD's 87 images x 300: 1.5 MB). A pass that asks for the val table's mean P and R (training's epochs) sends its
prediction rows too, and the worker matches them against the split it inherited, beside the evaluation. The numbers
are the in-process scoring's to the bit: the same functions on the same arrays (tests/metrics/test_background.py).

The helper process and its care (what a forked child of a training process may do) are :mod:`detector.forked`'s.

A worker that dies, fails or has not answered in :data:`SCORE_TIMEOUT_S` costs one warning line: that pass and the
rest of the run are scored in the training process.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np
import torch
from pycocotools.coco import COCO

from detector.data.build import SplitData
from detector.forked import ForkedHelper, HelperFailed
from detector.metrics.coco import EvalResult, evaluate_coco, resolve_backend
from detector.metrics.matching import with_precision_recall

# A pass the worker has not scored by then is scored in the training process (a worker that hangs must not hang the
# run): COCO val's 1.5M detections take ~10-20 s in one process on a server core.
SCORE_TIMEOUT_S = 600.0


class PendingScore:
    """One pass's COCO scores, being computed by the worker: :meth:`result` waits for them."""

    def __init__(self, receive: Callable[[], EvalResult]) -> None:
        self._receive = receive
        self._result: EvalResult | None = None

    def result(self) -> EvalResult:
        if self._result is None:
            self._result = self._receive()
        return self._result


class BackgroundScorer:
    """Scores validation passes against ``ground_truth`` in one forked worker, one pass at a time (see the module
    docstring): read each :class:`PendingScore` before submitting the next pass.

    Args:
        ground_truth: the split's COCO ground truth; the worker keeps the one it was forked with.
        backend: a :data:`detector.choices.COCO_EVAL` name, resolved here (its fallback line printed in this
            process, not the worker's).
        timeout: seconds a pass may take in the worker before it is scored here instead.
        split: the split whose labels a pass's prediction rows are matched against, for the pass that sends them
            (:func:`~detector.metrics.matching.with_precision_recall`); the worker keeps the one it was forked with.
    """

    def __init__(self, ground_truth: COCO, *, backend: str, timeout: float = SCORE_TIMEOUT_S,
                 split: SplitData | None = None) -> None:
        self.ground_truth, self.backend, self.timeout, self.split = ground_truth, resolve_backend(backend), timeout, split

        def score(job: tuple[np.ndarray, list[int] | None, str, np.ndarray | None]) -> EvalResult:  # in the worker
            detections, image_ids, backend, rows = job
            # The matching's torch operations on one thread: an OpenMP parallel region in a forked child of a process
            # that ran one hangs (libgomp's threads do not survive the fork; measured: a 10M-element exp never ended).
            torch.set_num_threads(1)
            result = evaluate_coco(ground_truth, detections, image_ids=image_ids, backend=backend, processes=False)
            return with_precision_recall(result, rows, split)

        self.helper = ForkedHelper(score, name="detector COCO scorer")
        self._outstanding = False  # a pass was sent and its answer not read yet
        self.failed = False  # the worker failed once: the rest of the run is scored here

    def submit(self, detections: np.ndarray, image_ids: list[int] | None,
               rows: np.ndarray | None = None) -> PendingScore:
        """Start scoring ``detections`` (:func:`~detector.metrics.coco.to_coco_detections` rows) over
        ``image_ids``, with ``rows`` (the pass's :func:`~detector.metrics.matching.prediction_rows`) its mean P and R
        against the scorer's split; returns at once (scores in this process, at once, once the worker has failed)."""
        if self._outstanding:
            raise RuntimeError("the last pass's PendingScore has not been read: one pass at a time")
        if rows is not None and self.split is None:
            raise ValueError("a pass's P and R need the split: BackgroundScorer(..., split=...)")

        def inline() -> EvalResult:
            result = evaluate_coco(self.ground_truth, detections, image_ids=image_ids, backend=self.backend)
            return with_precision_recall(result, rows, self.split)

        self.start()  # forked already, usually
        if self.helper.running:
            try:
                self._outstanding = True  # before the send: one cut short (a Ctrl-C) leaves a worker to kill
                self.helper.send((detections, image_ids, self.backend, rows))
                return PendingScore(lambda: self._receive(inline))
            except HelperFailed as error:  # it died since the last pass (a broken pipe)
                self._fail(str(error))
        result = inline()
        return PendingScore(lambda: result)

    def start(self) -> None:
        """Fork the worker unless it runs (or has failed): a run does so before its loaders' workers start, so it
        maps none of their shared-memory buffers; else the first pass does. A failure to fork costs one line."""
        if not self.failed and not self.helper.running:
            try:
                self.helper.start()
            except Exception as error:  # noqa: BLE001 - said once; the passes are scored in this process
                self._fail(f"{type(error).__name__}: {error}")

    def _receive(self, inline: Callable[[], EvalResult]) -> EvalResult:
        if not self.helper.running:  # closed since (an error stopped the run): nobody waits for a worker any more
            return inline()
        try:
            result = self.helper.receive(self.timeout)
        except HelperFailed as error:
            self._outstanding = False
            self._fail(str(error))
            return inline()
        self._outstanding = False
        return result

    def _fail(self, why: str) -> None:
        print(f"warning: COCO scoring in the background failed ({why}); scoring in the training process from now on",
              file=sys.stderr)
        self.failed = True
        self._outstanding = False
        self.helper.stop(kill=True)

    def close(self) -> None:
        """Stop the worker: at once if a pass is still being scored (nobody will read it: an error stopped the
        run), else after telling it to; a later :meth:`submit` forks a new one. Idempotent."""
        kill, self._outstanding = self._outstanding, False
        self.helper.stop(kill=kill)
