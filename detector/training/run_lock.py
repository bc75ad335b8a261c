"""A run folder's lock (``<run>/.lock``): one process trains a run (or runs a tune) at a time."""

from __future__ import annotations

import atexit
import os
from pathlib import Path
from typing import Any

from detector.checkpoint import CheckpointError

_RUN_LOCKS: dict[Path, Any] = {}  # run folder -> its lock file, held by this process until it exits


def hold_run_lock(run_dir: Path, doing: str = "training this run") -> None:
    """Lock ``<run>/.lock`` for this process's life (``flock``: the system releases it when the process ends, however
    it ends), so a second process resuming the same run (or resuming one still training) stops with one line
    instead of writing the same results.csv and checkpoints at once. No lock where ``fcntl`` is missing (Windows).
    The file is never deleted: a resume that opened it just before its unlink would lock the unlinked file while a
    third process created and locked a new one (both training the run); a killed run leaves it anyway."""
    try:
        import fcntl
    except ImportError:
        return
    if run_dir.resolve() in _RUN_LOCKS:  # this process's own earlier run of it (a resume in the same process)
        return
    handle = open(run_dir / ".lock", "a+")  # noqa: SIM115 - held open on purpose until the process exits
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip()
        handle.close()
        pid = f" (pid {holder})" if holder.isdigit() else ""
        raise CheckpointError(f"{run_dir}: another process{pid} is {doing} now; wait for it, or stop it "
                              "first") from None
    handle.truncate(0)
    handle.write(str(os.getpid()))
    handle.flush()
    if not _RUN_LOCKS:
        os.register_at_fork(after_in_child=_drop_inherited_run_locks)
    _RUN_LOCKS[run_dir.resolve()] = handle
    atexit.register(handle.close)  # closed (and so released) at exit, not left to the garbage collector


def release_run_lock(run_dir: Path) -> None:
    """Give up this process's lock on ``run_dir`` (:func:`hold_run_lock`): a tune run from Python ends long before its
    process does, and a resume from a shell would be told it is still running."""
    handle = _RUN_LOCKS.pop(run_dir.resolve(), None)
    if handle is not None:
        handle.close()


def _drop_inherited_run_locks() -> None:
    """In a forked child (a loader worker, a helper): close its copies of the run locks. A flock belongs to the open
    file, which a fork shares: workers outliving a killed trainer by seconds held the run locked, and an immediate
    ``--resume`` (a retry loop, a scheduler's requeue) was told another process was training it."""
    for handle in _RUN_LOCKS.values():
        handle.close()
    _RUN_LOCKS.clear()
