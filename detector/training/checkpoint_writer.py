"""Checkpoints written off the training thread: one writer thread, one file at a time, the newest per file wins.

The trainer snapshots the checkpoint (every tensor copied to the CPU, :func:`snapshot`) on the training thread, so
the next steps may change the live weights, optimizer state and BatchNorm counters while the writer works; then it
hands the snapshot to :class:`CheckpointWriter` and goes on training. The writer:

* writes through :func:`detector.checkpoint.save_checkpoint` (atomic: a temporary file renamed over the old one), so
  a crash, a full disk or a kill at any moment leaves the previous file whole;
* writes one file at a time, in submission order (``last.pt`` before ``best.pt``);
* keeps at most one pending snapshot per file: a newer ``last.pt`` replaces one still waiting (latest wins), so a
  slow disk costs memory for two snapshots at most, never a growing queue, and training never waits for it;
* stops at its first error and hands it to the training thread at the next :meth:`~CheckpointWriter.submit` or at
  :meth:`~CheckpointWriter.drain` (as one :class:`~detector.checkpoint.CheckpointError` line naming the file);
* is drained by the trainer before it reads ``best.pt`` again, before a Ctrl-C returns, and before the process
  exits (:meth:`~CheckpointWriter.close` in the run's ``finally``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from detector.checkpoint import CheckpointError, save_checkpoint, strip_checkpoint


def snapshot(value: Any) -> Any:
    """``value`` with every tensor copied to the CPU (dicts, lists and tuples rebuilt; other values shared).

    Copies even CPU tensors: a state dict's tensors share storage with the live parameters and buffers.
    """
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: snapshot(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(snapshot(item) for item in value)
    return value


class CheckpointWriter:
    """One background thread that writes checkpoint snapshots (see the module docstring).

    Args:
        save: writes one payload to one path (tests inject failures here); default :func:`save_checkpoint`.
        background: False writes on the caller's thread at :meth:`submit` (the same code path, synchronously).
    """

    def __init__(self, save: Callable[[dict[str, Any], Path], None] = save_checkpoint, *,
                 background: bool = True) -> None:
        self._save = save
        self.in_background = background  # False: each write happens at submit, on the caller's thread
        self._pending: dict[Path, tuple[dict[str, Any], bool]] = {}  # path -> (snapshot, strip), in order
        self._busy = False
        self._error: CheckpointError | None = None
        self._closed = False
        self._condition = threading.Condition()
        self.write_seconds = 0.0  # time the writer spent writing (off the training thread when in the background)
        self.writes = 0
        self._thread: threading.Thread | None = None

    def submit(self, path: Path, payload: dict[str, Any], *, strip: bool = False) -> None:
        """Queue ``payload`` (already a :func:`snapshot`) for ``path``; ``strip``: write its stripped form.

        Replaces a snapshot for the same path that is still waiting. Raises the writer's earlier error, if any.
        """
        with self._condition:
            self._raise_error()
            if self._closed:
                raise RuntimeError("checkpoint writer is closed")
            self._pending.pop(path, None)  # re-inserted last: files are written in submission order
            self._pending[path] = (payload, strip)
            if self.in_background:
                self._start()
                self._condition.notify_all()
                return
        self._write_pending()
        self._raise_error()

    def drain(self) -> None:
        """Wait until everything submitted is on disk; raise the writer's error, if any."""
        with self._condition:
            while (self._pending or self._busy) and self._error is None and self._thread_alive():
                self._condition.wait(timeout=0.5)
            self._raise_error()

    def close(self) -> None:
        """Drain, then stop the thread. Safe to call more than once, and after an error (it then raises it)."""
        try:
            self.drain()
        finally:
            with self._condition:
                self._closed = True
                self._condition.notify_all()
            if self._thread is not None:
                self._thread.join()

    # --------------------------------------------------------------------------------------- the thread
    def _start(self) -> None:
        if self._thread is None:
            # Not a daemon: the interpreter waits for it at exit, and it ends by itself once the thread that
            # submitted is gone (see _run), so a run that died without close() still finishes its file.
            self._thread = threading.Thread(target=self._run, name="checkpoint-writer", daemon=False)
            self._owner = threading.current_thread()
            self._thread.start()

    def _thread_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        while True:
            with self._condition:
                while not self._pending and not self._closed and self._owner.is_alive():
                    self._condition.wait(timeout=1.0)
                if not self._pending or self._error is not None:
                    self._pending.clear()
                    self._condition.notify_all()
                    return
            self._write_pending()

    def _write_pending(self) -> None:
        """Write every pending snapshot, oldest first, until done or the first error."""
        while True:
            with self._condition:
                if not self._pending or self._error is not None:
                    self._condition.notify_all()
                    return
                path = next(iter(self._pending))
                payload, strip = self._pending.pop(path)
                self._busy = True
            start = time.perf_counter()
            error = None
            try:
                self._save(strip_checkpoint(payload) if strip else payload, path)
            except CheckpointError as failure:
                error = failure
            except OSError as failure:  # a full disk, a lost mount, no permission: the old file is still whole
                reason = failure.strerror or type(failure).__name__
                error = CheckpointError(f"{path}: could not write the checkpoint ({reason}); the previous one is intact")
            with self._condition:
                self._busy = False
                self.write_seconds += time.perf_counter() - start
                self.writes += error is None
                if error is not None:
                    self._error = error
                    self._pending.clear()
                self._condition.notify_all()

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error
