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
(BCCD's 87 images x 300: 1.5 MB). The numbers are the in-process evaluation's to the bit: the same function on the
same arrays (tests/metrics/test_background.py).

A forked child of a training process must stay out of its parent's way:

* it runs numpy and the evaluator only, never CUDA (a forked child of a CUDA process must not), scores in its one
  process (no forks of its own), and never collects the objects it inherited (``gc.freeze``: their finalizers,
  CUDA tensors' among them, are the parent's);
* it writes to no inherited stream (another thread of the parent may have held one's lock at the fork);
* it ignores SIGINT, as the loader's workers do (the trainer's Ctrl-C handler decides, once), and dies with its
  parent (Linux's parent-death signal: a trainer killed by the OOM killer or torchrun's SIGTERM leaves no worker).

A worker that dies, fails or has not answered in :data:`SCORE_TIMEOUT_S` costs one warning line: that pass and the
rest of the run are scored in the training process.
"""

from __future__ import annotations

import ctypes
import gc
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

import numpy as np
from pycocotools.coco import COCO

from detector.metrics.coco import EvalResult, evaluate_coco, resolve_backend

# A pass the worker has not scored by then is scored in the training process (a worker that hangs must not hang the
# run): COCO val's 1.5M detections take ~10-20 s in one process on a server core.
SCORE_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 5.0  # a worker told to stop that is still alive after this is killed
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

# What the forked worker scores against: set in the parent around the fork only, read in the child.
_forked_ground_truth: COCO | None = None


def background_available() -> bool:
    """Whether this process can fork a worker: not on Windows (spawn only), and not from a daemonic process (a
    ``multiprocessing`` pool's worker running a training), which may have no children."""
    return "fork" in multiprocessing.get_all_start_methods() and not multiprocessing.current_process().daemon


def _die_with_parent(parent: int) -> None:
    """Ask the kernel (Linux) to kill this process when its parent dies; exit if the parent died already."""
    try:  # prctl(int option, unsigned long arg2, ...): the signal as an unsigned long
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL))
    except (OSError, AttributeError):  # not Linux (or it failed): the pipe's end of file still stops an idle worker
        pass
    if os.getppid() != parent:
        os._exit(0)


def _serve(jobs: Connection, parents_end: Connection, parent: int) -> None:
    """The worker: score each ``(detections, image ids, backend)`` job, answering ``("ok", EvalResult)`` or
    ``("error", message)``; stop at ``None`` or when the parent's end closes."""
    gc.freeze()  # first: the parent forked with the collector off (see _worker), so nothing inherited was collected
    gc.enable()
    parents_end.close()  # this copy of the parent's end would keep the pipe open after the parent died
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(parent)
    sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - for the process's life
    while True:
        try:
            job = jobs.recv()
        except EOFError:
            return
        if job is None:
            return
        detections, image_ids, backend = job
        try:
            answer = ("ok", evaluate_coco(_forked_ground_truth, detections, image_ids=image_ids, backend=backend,
                                          processes=False))
        except Exception as error:  # noqa: BLE001 - said in the parent, which scores the pass itself
            answer = ("error", f"{type(error).__name__}: {error}")
        jobs.send(answer)


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
    """

    def __init__(self, ground_truth: COCO, *, backend: str, timeout: float = SCORE_TIMEOUT_S) -> None:
        self.ground_truth, self.backend, self.timeout = ground_truth, resolve_backend(backend), timeout
        self._process: BaseProcess | None = None
        self._jobs: Connection | None = None
        self._outstanding = False  # a pass was sent and its answer not read yet
        self.failed = False  # the worker failed once: the rest of the run is scored here

    def submit(self, detections: np.ndarray, image_ids: list[int] | None) -> PendingScore:
        """Start scoring ``detections`` (:func:`~detector.metrics.coco.to_coco_detections` rows) over
        ``image_ids``; returns at once (scores in this process, at once, once the worker has failed)."""
        if self._outstanding:
            raise RuntimeError("the last pass's PendingScore has not been read: one pass at a time")

        def inline() -> EvalResult:
            return evaluate_coco(self.ground_truth, detections, image_ids=image_ids, backend=self.backend)

        self.start()  # forked already, usually
        if self._jobs is not None:
            try:
                self._outstanding = True  # before the send: one cut short (a Ctrl-C) leaves a worker to kill
                self._jobs.send((detections, image_ids, self.backend))
                return PendingScore(lambda: self._receive(inline))
            except Exception as error:  # noqa: BLE001 - it died since the last pass (a broken pipe)
                self._fail(f"{type(error).__name__}: {error}")
        result = inline()
        return PendingScore(lambda: result)

    def start(self) -> None:
        """Fork the worker unless it runs (or has failed): a run does so before its loaders' workers start, so it
        maps none of their shared-memory buffers; else the first pass does. A failure to fork costs one line."""
        if not self.failed and self._jobs is None:
            try:
                self._worker()
            except Exception as error:  # noqa: BLE001 - said once; the passes are scored in this process
                self._fail(f"{type(error).__name__}: {error}")

    def _receive(self, inline: Callable[[], EvalResult]) -> EvalResult:
        if self._jobs is None:  # closed since (an error stopped the run): nobody waits for a worker any more
            return inline()
        deadline = time.monotonic() + self.timeout
        try:  # a KeyboardInterrupt here leaves the pass outstanding: close() then kills the worker at once
            while not self._jobs.poll(1.0):  # a dead worker's end closes: poll says readable, recv raises
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no answer in {self.timeout:.0f} s")
            status, value = self._jobs.recv()
        except (OSError, EOFError, TimeoutError) as error:
            status, value = "error", f"{type(error).__name__}: {error}" if str(error) else "the worker died"
        self._outstanding = False
        if status == "ok":
            return value
        self._fail(value)
        return inline()

    def _fail(self, why: str) -> None:
        print(f"warning: COCO scoring in the background failed ({why}); scoring in the training process from now on",
              file=sys.stderr)
        self.failed = True
        self._stop(kill=True)

    def _worker(self) -> Connection:
        global _forked_ground_truth
        if self._jobs is None:
            context = multiprocessing.get_context("fork")
            ours, theirs = context.Pipe()
            _forked_ground_truth = self.ground_truth
            # No collection between the fork and the child's gc.freeze: it would run this process's finalizers
            # (unreachable cycles of the trainer's, CUDA tensors' among them) in the child (gc.freeze's advice).
            collecting = gc.isenabled()
            gc.disable()
            try:  # daemonic: multiprocessing also stops it at this process's exit
                process = context.Process(target=_serve, args=(theirs, ours, os.getpid()), daemon=True,
                                          name="detector COCO scorer")
                process.start()
            except BaseException:
                ours.close()
                theirs.close()
                raise
            finally:
                _forked_ground_truth = None  # the child has its copy; this process keeps no reference
                if collecting:
                    gc.enable()
            theirs.close()
            self._process, self._jobs = process, ours
        return self._jobs

    def close(self) -> None:
        """Stop the worker: at once if a pass is still being scored (nobody will read it: an error stopped the
        run), else after telling it to; a later :meth:`submit` forks a new one. Idempotent."""
        self._stop(kill=self._outstanding)

    def _stop(self, *, kill: bool) -> None:
        process, jobs = self._process, self._jobs
        self._process, self._jobs, self._outstanding = None, None, False
        if process is None or jobs is None:
            return
        try:
            if kill:
                process.kill()
            else:
                jobs.send(None)
        except OSError:  # it is gone already
            pass
        process.join(STOP_TIMEOUT_S)
        if process.is_alive():
            process.kill()
            process.join()
        jobs.close()
