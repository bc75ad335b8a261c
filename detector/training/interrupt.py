"""Ctrl-C during training: the first one asks the run to stop after this epoch (saving last.pt), a second aborts.

SIGTERM to the trainer (``kill``, ``docker stop``, Kubernetes' preemption) is a first Ctrl-C too: the epoch ends and
last.pt is saved, as the grace period allows. So is a SIGTERM to every process of the run (torchrun's to each rank's
process group, SLURM's to a job step): the loader's workers and helpers take SIGTERM from their parent alone
(detector/forked.py), and the trainer ends them once it has saved."""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType
from typing import Any, Callable


class CtrlC:
    """A SIGINT handler for the duration of a run: :attr:`requested` turns true on the first Ctrl-C.

    Args:
        single_process: False under torchrun, where a Ctrl-C reaches each worker twice (from the terminal and
            forwarded by the launcher), so a second one must not abort; torchrun ends lingering workers itself.
        announce: print the "finishing this epoch" line (rank 0).
    """

    def __init__(self, *, single_process: bool, announce: bool) -> None:
        self.requested = False
        self.single_process, self.announce = single_process, announce
        self.pid = os.getpid()  # the process whose handler this is (see handle)
        self._previous: Callable[..., Any] | int | None = None
        self._previous_term: Callable[..., Any] | int | None = None
        self._stream = sys.stdout

    def install(self) -> None:
        # The stream of the run, not the one current when the signal lands: pycocotools' evaluation runs with
        # stdout redirected into a buffer that is thrown away, and a SIGTERM there lost the line (a flaky CI run).
        self._stream = sys.stdout
        self._previous = signal.signal(signal.SIGINT, self.handle)
        self._previous_term = signal.signal(signal.SIGTERM, self.handle)

    def restore(self) -> None:
        signal.signal(signal.SIGINT, self._previous if self._previous is not None else signal.default_int_handler)
        signal.signal(signal.SIGTERM, self._previous_term if self._previous_term is not None else signal.SIG_DFL)

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self.pid:  # a loader worker forked after this handler, before its worker_init_fn
            return  # set SIGINT to ignored (detector/data/workers.py): the parent decides, not the worker
        if self.requested and self.single_process:
            raise KeyboardInterrupt
        self.requested = True
        if self.announce:
            what = "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C"
            print(f"\n{what}: finishing this epoch and saving last.pt (press Ctrl-C again to abort)", file=self._stream,
                  flush=True)
