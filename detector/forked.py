"""One forked helper process of a training run: jobs in, answers out, over a pipe.

The training process hands host work that would otherwise hold its GIL to a helper it forks once: COCO scoring
(detector/metrics/background.py) and matplotlib's figures (detector/plots/worker.py). A thread would not do: both are
mostly Python, and a Python loop beside an evaluation thread ran at 0.69 of its speed alone on a 2-core AMD EPYC.
Forked, the helper inherits what its jobs read (a split's ground truth, its label records) instead of receiving it:
a job is small (a detections array, a figure's few arrays and paths).

A forked child of a training process must stay out of its parent's way:

* it never touches CUDA (a forked child of a CUDA process must not), and never collects the objects it inherited
  (``gc.freeze`` first: their finalizers, CUDA tensors' among them, are the parent's; the parent forks with its
  collector off, so none ran in between);
* it writes to no inherited stream (another thread of the parent may have held one's lock at the fork);
* it ignores SIGINT, as the loader's workers do (the trainer's Ctrl-C handler decides, once), takes SIGTERM from its
  parent alone (:func:`end_at_parents_sigterm_only`, the loader's workers too), and dies with its parent (Linux's
  parent-death signal: a trainer killed by the OOM killer leaves no helper).

Every job gets one answer, in order: ``("ok", value)`` or ``("error", message)``.
"""

from __future__ import annotations

import ctypes
import gc
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

STOP_TIMEOUT_S = 5.0  # a helper told to stop that is still alive after this is killed
# A run hands work to a helper by default only where the host has at least this many cores: the helper takes one
# beside the training loop, the pin thread and the loader's workers (2-core CPU, the 30-epoch shapes run, one run
# each: 67.1 s wall with the COCO scorer against 61.5 s inline; 46.7 s with the figures' helper against 44.2 s).
HELPER_MIN_CORES = 4
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class HelperFailed(Exception):
    """The helper died, did not answer in time, or its job raised: the message says which."""


class JobFailed(HelperFailed):
    """The job raised in the helper, which is still running and answers the next one."""


def fork_available() -> bool:
    """Whether this process can fork a helper: not on Windows (spawn only), and not from a daemonic process (a
    ``multiprocessing`` pool's worker running a training), which may have no children."""
    return "fork" in multiprocessing.get_all_start_methods() and not multiprocessing.current_process().daemon


def _die_with_parent(parent: int) -> None:
    """Ask the kernel (Linux) to kill this process when its parent dies; exit if the parent died already."""
    try:  # prctl(int option, unsigned long arg2, ...): the signal as an unsigned long
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL))
    except (OSError, AttributeError):  # not Linux (or it failed): the pipe's end of file still stops an idle helper
        pass
    if os.getppid() != parent:
        os._exit(0)


def end_at_parents_sigterm_only(parent: int) -> None:
    """Let SIGTERM end this child process only where ``parent`` sent it; from anyone else it is dropped.

    torchrun ends a rank by signalling the rank's whole process group, and SLURM signals every process of a job step.
    A loader worker (or helper) that died of that SIGTERM took its trainer down with "DataLoader worker exited
    unexpectedly" before the trainer's own handler could finish the epoch and save last.pt. Ignored outright, the
    signal would be lost where the parent sends it: multiprocessing ends its daemonic children with SIGTERM at exit,
    as torch's loader does with a worker slow to stop, and a child that outlives that hangs the exit. So SIGTERM is
    blocked in every thread of this process and one thread waits for it: from ``parent`` it exits at once, status 0
    as torch's own worker handler does; otherwise the parent, which got the signal too, decides (it finishes the
    epoch, then ends its children). Without ``sigwaitinfo`` (macOS) SIGTERM keeps its default.

    Call it from the process's main thread, before it starts any other (they inherit the blocked signal).
    """
    if not hasattr(signal, "sigwaitinfo"):
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    threading.Thread(target=_await_parents_sigterm, args=(parent,), name="sigterm", daemon=True).start()


def _await_parents_sigterm(parent: int) -> None:
    while True:
        if signal.sigwaitinfo({signal.SIGTERM}).si_pid == parent:
            os._exit(0)


def _serve(handle: Callable[[Any], Any], jobs: Connection, parents_end: Connection, parent: int) -> None:
    """The helper: answer each job with ``handle(job)``; stop at ``None`` or when the parent's end closes."""
    gc.freeze()  # first: the parent forked with the collector off (see ForkedHelper.start)
    gc.enable()
    parents_end.close()  # this copy of the parent's end would keep the pipe open after the parent died
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    end_at_parents_sigterm_only(parent)
    _die_with_parent(parent)
    sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - for the process's life
    while True:
        try:
            job = jobs.recv()
        except EOFError:
            return
        if job is None:
            return
        try:
            answer = ("ok", handle(job))
        except Exception as error:  # noqa: BLE001 - said in the parent, which decides what to do
            answer = ("error", f"{type(error).__name__}: {error}")
        jobs.send(answer)


class ForkedHelper:
    """A process forked from this one that answers jobs with ``handle(job)``, one at a time, in order.

    Args:
        handle: runs in the helper; reads what it needs from the memory the helper inherited (a closure over it).
        name: the process's name (``ps`` shows it).
    """

    def __init__(self, handle: Callable[[Any], Any], *, name: str) -> None:
        self.handle, self.name = handle, name
        self._process: BaseProcess | None = None
        self._jobs: Connection | None = None

    @property
    def running(self) -> bool:
        return self._jobs is not None

    def start(self) -> None:
        """Fork the helper (once; raises what a failed fork raises)."""
        if self._jobs is not None:
            return
        context = multiprocessing.get_context("fork")
        ours, theirs = context.Pipe()
        # No collection between the fork and the child's gc.freeze: it would run this process's finalizers
        # (unreachable cycles of the trainer's, CUDA tensors' among them) in the child (gc.freeze's advice).
        collecting = gc.isenabled()
        gc.disable()
        try:  # daemonic: multiprocessing also stops it at this process's exit
            process = context.Process(target=_serve, args=(self.handle, theirs, ours, os.getpid()), daemon=True,
                                      name=self.name)
            process.start()
        except BaseException:
            ours.close()
            theirs.close()
            raise
        finally:
            if collecting:
                gc.enable()
        theirs.close()
        self._process, self._jobs = process, ours

    def send(self, job: Any) -> None:
        """Hand the helper a job (raises :class:`HelperFailed` where it is gone)."""
        if self._jobs is None:
            raise HelperFailed("not running")
        try:
            self._jobs.send(job)
        except (OSError, ValueError) as error:  # a broken pipe: it died
            raise HelperFailed(f"{type(error).__name__}: {error}") from None

    def ready(self) -> bool:
        """Whether an answer (or the helper's death) can be read without waiting."""
        return self._jobs is not None and self._jobs.poll(0)

    def receive(self, timeout: float) -> Any:
        """The next job's answer; :class:`JobFailed` where the job raised, :class:`HelperFailed` where the helper died
        or ``timeout`` passed."""
        if self._jobs is None:
            raise HelperFailed("not running")
        deadline = time.monotonic() + timeout
        try:  # a KeyboardInterrupt here leaves a job outstanding: stop(kill=True) ends the helper at once
            while not self._jobs.poll(1.0):  # a dead helper's end closes: poll says readable, recv raises
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no answer in {timeout:.0f} s")
            status, value = self._jobs.recv()
        except (OSError, EOFError, TimeoutError) as error:
            raise HelperFailed(f"{type(error).__name__}: {error}" if str(error) else "the helper died") from None
        if status != "ok":
            raise JobFailed(value)
        return value

    def stop(self, *, kill: bool) -> None:
        """End the helper: at once with ``kill`` (nobody will read what it is doing), else after telling it to.
        A later :meth:`start` forks a new one. Idempotent."""
        process, jobs = self._process, self._jobs
        self._process, self._jobs = None, None
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
