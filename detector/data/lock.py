"""One download of a thing at a time: an exclusive ``fcntl.flock`` on a ``.lock`` file beside what it writes.

Two downloads of one dataset write the same ``<file>.part`` (the second truncated the first's, and both failed,
throwing away what had come of COCO's 19 GB) and extract into the same folder. The lock is taken without waiting: the
second command stops at once and names the first one's pid. Waiting instead would look like a hang for as long as the
first transfer takes (hours for COCO), and two downloads of one thing are nearly always a mistake (a script run
twice, a second terminal), which the pid lets the user check.

The kernel drops the lock of a process that dies, even by SIGKILL, so a ``.lock`` file left behind locks nothing. Where
``fcntl`` is missing (Windows) or the filesystem has no locks, downloads go on unguarded, as they did before.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]


class Busy(Exception):
    """Another process holds the lock; ``pid`` is its process id, or None when it could not be read."""

    def __init__(self, pid: int | None) -> None:
        super().__init__(pid)
        self.pid = pid


def _holder(fd: int) -> int | None:
    """The pid the holder wrote into the file (none yet in the moment after it locked it)."""
    try:
        return int(os.pread(fd, 32, 0).decode().strip())
    except (OSError, ValueError):
        return None


def _locked(path: Path) -> int | None:
    """An open descriptor of ``path`` locked by this process, None where locks are unavailable; raises Busy."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _holder(fd)
            os.close(fd)
            raise Busy(pid) from None
        except OSError:  # a filesystem without locks (ENOLCK): go on unguarded rather than refuse every download
            os.close(fd)
            return None
        # The holder before us deletes the file while it still holds the lock: a lock on a file that is no longer
        # at ``path`` guards nothing, so open the new one.
        try:
            here = os.stat(path)
        except FileNotFoundError:
            here = None
        mine = os.fstat(fd)
        if here is not None and (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino):
            return fd
        os.close(fd)


@contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created, and deleted again on the way out) for the ``with`` block.

    Raises :class:`Busy` at once when another process holds it. Two descriptors of one file opened by one process
    lock each other out too (``flock`` locks belong to the open file), so a nested use in one process is refused.
    """
    fd = _locked(path) if fcntl is not None else None
    if fd is None:
        yield
        return
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        path.unlink(missing_ok=True)  # before the unlock: see _locked
        os.close(fd)
