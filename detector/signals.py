"""SIGTERM handled as Ctrl-C: a block that must clean up (a download's staging folder, a tune's training child)
unwinds from it as from Ctrl-C, and the command ends with 143, the code of a process the signal killed."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Terminated(KeyboardInterrupt):
    """A SIGTERM a command unwinds from as from Ctrl-C (download's staging folder and lock are removed on the way
    out), ending with 143 as a process killed by it does, not Ctrl-C's 130: a job scheduler reads the signal from
    the code."""


def _terminated(signum: int, frame: object) -> None:
    raise Terminated


@contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """SIGTERM (``kill``, ``docker stop``, a job's time limit) unwinds the block like Ctrl-C, its ``finally`` clauses
    run (Python leaves the signal fatal), and the command exits with 143 (:class:`Terminated`), as a process the signal
    killed does, not Ctrl-C's 130."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
