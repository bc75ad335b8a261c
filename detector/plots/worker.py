"""A training run's matplotlib figures drawn by a helper process, so the training process neither imports
matplotlib nor waits for a figure.

matplotlib is all Python: a run's figures cost its training thread 4-5 s on a 2-core Xeon (the import 0.4-0.9 s,
labels.png 0.8 s, each results.png 0.9-1.0 s, the PR curves and confusion matrix 0.7 s), against 30-50 s of training
and validation in a short run (docs/training-log.md, 2026-11-27). :class:`FigureWorker` forks one helper
(detector/forked.py) at the start of the run and sends it each figure's data, small arrays and paths (what it
inherited at the fork, the training split's label records, it reads from its own memory: :class:`Inherited`); the
helper answers with the seconds the figure took. The run waits for its figures once, at its end
(:meth:`FigureWorker.close`), so every file is on disk when ``train`` returns, as before.

Where the helper cannot be forked, dies or hangs, the figures it had not drawn and the rest are drawn in the training
process (one warning line), as they are on a CPU run or a host with too few cores (:func:`figures_in_background`).
A figure that fails in the helper is one warning line and the helper draws the next; drawn in the training process,
its error goes up to the caller, as it always has (the reporter's last redraw turns it into one warning).
"""

from __future__ import annotations

import sys
import time
from collections import deque
from typing import Any, NamedTuple

import torch

from detector.forked import HELPER_MIN_CORES, ForkedHelper, HelperFailed, JobFailed, fork_available
from detector.plots import draw as draw_here

# A figure the helper has not drawn by then is drawn here instead (a helper that hangs must not hang the run's end).
FIGURE_TIMEOUT_S = 300.0


def figures_in_background(device: torch.device, cores: int) -> bool:
    """Whether a run on ``device``, on a host with ``cores`` usable cores, draws its figures in a helper: on a GPU,
    whose step leaves the host's cores free, with a core to spare (:data:`~detector.forked.HELPER_MIN_CORES`); a CPU
    run's step uses them all, as the background scorer's ``auto`` says too (detector/training/validator.py)."""
    return device.type == "cuda" and cores >= HELPER_MIN_CORES and fork_available()


class Inherited(NamedTuple):
    """An argument of a figure that the helper reads from what it inherited at the fork (:meth:`FigureWorker.inherit`)
    instead of receiving it: a COCO-sized split's labels are ~0.9M boxes."""

    key: str


def _draw_timed(job: tuple[str, tuple[Any, ...]], inherited: dict[str, Any]) -> float:
    """Draw one figure; -> the seconds it took."""
    name, args = job
    start = time.perf_counter()
    draw_here(name, *(inherited[arg.key] if isinstance(arg, Inherited) else arg for arg in args))
    return time.perf_counter() - start


class FigureWorker:
    """Draws figures in one forked helper, in the order asked, or in this process (``background=False``, or once
    the helper failed). Call :meth:`start` before the run's loaders fork their workers, :meth:`close` at its end.

    Attributes:
        seconds: the last time each figure took to draw (its name -> seconds), wherever it was drawn.
    """

    def __init__(self, *, background: bool, timeout: float = FIGURE_TIMEOUT_S) -> None:
        self.timeout = timeout
        self._inherited: dict[str, Any] = {}  # the helper's copy is the one of the moment it was forked
        inherited = self._inherited
        self.helper = (ForkedHelper(lambda job: _draw_timed(job, inherited), name="detector figures")
                       if background else None)
        self._waiting: deque[tuple[str, tuple[Any, ...]]] = deque()  # sent, not answered yet
        self._unsure = False  # a send or receive was cut short (a Ctrl-C): the answers may no longer match the queue
        self.seconds: dict[str, float] = {}

    @property
    def in_background(self) -> bool:
        return self.helper is not None

    def inherit(self, key: str, value: Any) -> None:
        """Make ``value`` what an :class:`Inherited` ``key`` argument reads: call before :meth:`start`."""
        self._inherited[key] = value

    def start(self) -> None:
        """Fork the helper (a failure costs one line: the figures are drawn here)."""
        if self.helper is not None and not self.helper.running:
            try:
                self.helper.start()
            except Exception as error:  # noqa: BLE001 - said once; drawn in this process instead
                self._fail(f"{type(error).__name__}: {error}")

    def draw(self, name: str, *args: Any) -> None:
        """Draw figure ``name`` (a :mod:`detector.plots` function) of ``args`` (picklable: arrays, lists, paths, or
        :class:`Inherited` values)."""
        self._collect(wait=False)
        if self.helper is not None:
            self.start()
        if self.helper is None:
            self._draw_here(name, args, warn=False)
            return
        self._waiting.append((name, args))
        try:
            self.helper.send((name, args))
        except HelperFailed as error:
            self._fail(str(error))  # draws it here, with the others not drawn yet
        except BaseException:
            self._unsure = True
            raise

    def pending(self, name: str) -> bool:
        """Whether figure ``name`` was asked for and is not drawn yet."""
        self._collect(wait=False)
        return any(waiting == name for waiting, _ in self._waiting)

    def close(self) -> None:
        """Wait until every figure asked for is drawn, then stop the helper; a wait cut short (a Ctrl-C) kills it.
        Safe to call again."""
        finished = False
        try:
            if not self._unsure:  # else no answer may come for what is waiting: stop at once
                self._collect(wait=True)
                finished = True
        finally:
            if self.helper is not None:
                self.helper.stop(kill=not finished)
                self._waiting.clear()

    def _collect(self, *, wait: bool) -> None:
        """Read the helper's answers: those ready, or (``wait``) all of them."""
        while self._waiting and self.helper is not None and (wait or self.helper.ready()):
            name, _ = self._waiting[0]
            try:
                self.seconds[name] = self.helper.receive(self.timeout)
            except JobFailed as error:  # that figure only: the helper goes on with the next
                print(f"warning: {name}: not drawn ({error})", file=sys.stderr)
            except HelperFailed as error:
                self._fail(str(error))
                return
            except BaseException:
                self._unsure = True
                raise
            self._waiting.popleft()

    def _draw_here(self, name: str, args: tuple[Any, ...], *, warn: bool) -> None:
        """Draw a figure in this process; ``warn``: a failure is one line instead of the caller's exception."""
        try:
            self.seconds[name] = _draw_timed((name, args), self._inherited)
        except Exception as error:
            if not warn:
                raise
            print(f"warning: {name}: not drawn ({type(error).__name__}: {error})", file=sys.stderr)

    def _fail(self, why: str) -> None:
        """Say so once, stop the helper, and draw here what it had not drawn (the figures are never lost)."""
        print(f"warning: drawing figures in a helper process failed ({why}); drawing them in the training process "
              "from now on", file=sys.stderr)
        helper, self.helper = self.helper, None
        if helper is not None:
            helper.stop(kill=True)
        while self._waiting:
            name, args = self._waiting.popleft()
            self._draw_here(name, args, warn=True)  # each one line: the one it died on may fail here too
