"""Checkpoints written off the training thread: one writer thread, one file at a time, the newest per file wins.

The trainer takes what the writer needs on the training thread, so that the next steps may change the live weights,
optimizer state and BatchNorm counters while the writer works; then it hands it to :class:`CheckpointWriter` and
goes on training. On a GPU that is a snapshot (every tensor copied to the CPU, :func:`snapshot`), which the writer
serialises and writes. On the CPU (``serialise_here``) it is the file's bytes (:func:`encode_checkpoint`): the live
state serialised without a copy, since a copy cost a CPU run ~2%, and a writer thread that serialised took cores
from the step; the writer only writes them (a copy into the page cache) and waits for the disk (``fsync``).
The writer:

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

import io
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch

from detector.checkpoint import (CheckpointError, host_copies, load_checkpoint, refuse_non_finite, save_checkpoint,
                                 strip_checkpoint)


def snapshot(value: Any) -> Any:
    """``value`` with every tensor copied to the CPU (dicts, lists and tuples rebuilt; other values shared).

    Copies even CPU tensors: a state dict's tensors share storage with the live parameters and buffers. Those on a
    GPU are copied out together (:func:`~detector.checkpoint.host_copies`), not one wait each.
    """
    found: list[torch.Tensor] = []
    _rebuild(value, found.append)
    copies = iter(host_copies(found))
    return _rebuild(value, lambda tensor: next(copies))


def _rebuild(value: Any, tensor_to: Callable[[torch.Tensor], Any]) -> Any:
    """``value`` with each tensor replaced by ``tensor_to(tensor)``, in a fixed order (dicts, lists and tuples
    rebuilt; other values shared)."""
    if isinstance(value, torch.Tensor):
        return tensor_to(value)
    if isinstance(value, dict):
        return {key: _rebuild(item, tensor_to) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_rebuild(item, tensor_to) for item in value)
    return value


def stripped_snapshot(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """:func:`snapshot` of ``checkpoint``'s stripped form, without copying its weights twice: the stripped weights
    are copies already (FP16 where they fit, :func:`~detector.checkpoint.to_half`). An epoch that improves while
    last.pt is not due pays this on the training thread (BCCD on a GPU: most of its 100 epochs)."""
    stripped = strip_checkpoint(checkpoint)
    return {**snapshot({key: value for key, value in stripped.items() if key != "model"}), "model": stripped["model"]}


def encode_checkpoint(payload: dict[str, Any], path: Path) -> memoryview:
    """``payload`` serialised as :func:`~detector.checkpoint.save_checkpoint` writes it, which writes these bytes
    as they are. Refuses non-finite weights as it does, naming ``path``, the file they are meant for."""
    refuse_non_finite(payload, path)
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.getbuffer()


class CheckpointWriter:
    """One background thread that writes checkpoints, snapshots or encoded bytes (see the module docstring).

    Args:
        save: writes one payload to one path (tests inject failures here); default :func:`save_checkpoint`.
    """

    def __init__(self, save: Callable[[dict[str, Any] | memoryview, Path], None] = save_checkpoint) -> None:
        self._save = save
        self._pending: dict[Path, tuple[dict[str, Any] | memoryview, bool]] = {}  # path -> (payload, strip), in order
        self._busy = False
        self._error: Exception | None = None  # a CheckpointError line, or what no write should raise
        self._closed = False
        self._condition = threading.Condition()
        self.write_seconds = 0.0  # time the writer thread spent writing
        self.writes = 0
        self._thread: threading.Thread | None = None

    def submit(self, path: Path, payload: dict[str, Any] | memoryview, *, strip: bool = False) -> None:
        """Queue ``payload`` (a :func:`snapshot`, or the bytes of :func:`encode_checkpoint`) for ``path``; ``strip``:
        write its stripped form (a snapshot's only).

        Replaces a snapshot for the same path that is still waiting. Raises the writer's earlier error, if any.
        """
        with self._condition:
            self._raise_error()
            if self._closed:
                raise RuntimeError("checkpoint writer is closed")
            self._pending.pop(path, None)  # re-inserted last: files are written in submission order
            self._pending[path] = (payload, strip)
            self._start()
            self._condition.notify_all()

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
                kept = "the previous one is intact" if path.exists() else "there is no previous one"
                error = CheckpointError(f"{path}: could not write the checkpoint ({reason}); {kept}")
            except Exception as failure:  # noqa: BLE001 - anything else too: a writer thread that died of it left
                error = failure  # the run going on without checkpoints; raised on the training thread, traceback kept
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


# Checkpoint writes may take this share of a run at most. Each write is timed, and the next last.pt waits until the
# run has gone on for write/SHARE seconds: an epoch longer than 50 writes (a 0.25 s write: 12.5 s) checkpoints every
# epoch, as before; shorter epochs checkpoint every few, and a crash loses at most those 50 writes' worth of training.
SHARE = 0.02


class Cadence:
    """When last.pt is due: always the first time and when ``must``; otherwise once the time since the last write
    is at least that write's cost divided by ``share`` (so writes take at most ``share`` of the run)."""

    def __init__(self, share: float = SHARE, clock: Callable[[], float] = time.perf_counter) -> None:
        self.share, self.clock = share, clock
        self.cost = 0.0
        self.written_at: float | None = None

    def due(self, *, must: bool = False, writer_seconds: float = 0.0) -> bool:
        """``writer_seconds``: what the writer thread spent on the last hand-over's files, where its work takes
        cores from the step (the CPU's), counted with the training thread's part."""
        if must or self.written_at is None:
            return True
        return (self.clock() - self.written_at) * self.share >= self.cost + writer_seconds

    def wrote(self, started: float) -> None:
        """A write that began at ``started`` (this cadence's clock) has just been handed over."""
        self.written_at = self.clock()
        self.cost = self.written_at - started


class RunCheckpoints:
    """A run's ``last.pt`` and ``best.pt``: :class:`Cadence` decides when, :class:`CheckpointWriter` writes.

    ``best.pt`` still holds the best epoch's weights whenever that epoch's last.pt was not due: its stripped
    snapshot (EMA weights in FP16, a few MB) waits in memory until the next write, the end of the run, a Ctrl-C or
    an error (:meth:`close`), so no improvement is ever lost. An epoch whose validation is still being scored
    (``improved=None``) leaves its stripped snapshot as the candidate, which :meth:`judged` makes the held best.pt
    or drops.
    """

    def __init__(self, folder: Path, *, serialise_here: bool, log: Callable[[str], None],
                 cadence: Cadence | None = None,
                 detail: Callable[[str], AbstractContextManager[None]] = lambda name: nullcontext(),
                 period: int = 0) -> None:
        self.last, self.best = folder / "last.pt", folder / "best.pt"
        self.period = period  # --save-period: every this many epochs a lasting epoch<N>.pt too (0: none)
        self.writer = CheckpointWriter()
        self.serialise_here = serialise_here  # the CPU: the live state encoded here, the writer writes the bytes
        self.handed_over_at = 0.0  # the writer's write_seconds when the last files were handed to it
        self.cadence = cadence or Cadence()
        self.log = log
        self.detail = detail  # times a part of the work ("encoding", "copies", "writes"): the run's time account
        self.held_best: dict[str, Any] | None = None
        self.candidate: dict[str, Any] | None = None  # the stripped snapshot of an epoch not judged yet
        self.said_so = False

    def epoch_done(self, checkpoint: Callable[[], dict[str, Any]], *, improved: bool | None, finished: bool,
                   wait: bool, epoch: int = -1) -> None:
        """Epoch ``epoch`` (0-based) ended: write last.pt (stripped when the run ``finished``) and best.pt when it
        ``improved``, or hold best.pt when last.pt is not due; ``improved=None`` (not known yet): keep the candidate
        for :meth:`judged`. ``wait``: return once both are on disk. Every ``period``-th epoch (counted from 1)
        last.pt is due, and the same checkpoint is kept as ``epoch<N>.pt`` (Ultralytics' ``save_period``)."""
        kept = self.period > 0 and (epoch + 1) % self.period == 0
        must = finished or wait or kept
        # On the CPU the writer's time counts too: its writes take the step's cores (a GPU run's have cores spare).
        writer_seconds = self.writer.write_seconds - self.handed_over_at if self.serialise_here else 0.0
        if not self.cadence.due(must=must, writer_seconds=writer_seconds):
            if improved is not False:
                state = checkpoint()
                with self.detail("copies"):
                    held = stripped_snapshot(state)
                if improved is None:
                    self.candidate = held
                else:
                    self.held_best = held
            self._say_once()
            return
        started = self.cadence.clock()
        state = checkpoint()
        last: dict[str, Any] | memoryview
        best: dict[str, Any] | memoryview | None = None
        if self.serialise_here:  # the live state as it is now, before the next step changes it: no copy
            with self.detail("encoding"):
                last = encode_checkpoint(strip_checkpoint(state) if finished else state, self.last)
                if improved:
                    best = last if finished else encode_checkpoint(strip_checkpoint(state), self.best)
            if improved is None:
                with self.detail("copies"):
                    self.candidate = stripped_snapshot(state)
            strip_last = strip_best = False
        else:  # the next steps change the live tensors while the writer works: it gets a copy to serialise
            with self.detail("copies"):
                last = snapshot(state)
                if improved is None:  # the writer strips its own payload; the candidate is a stripped copy of it
                    self.candidate = strip_checkpoint(last)
            best = last if improved else None
            strip_last, strip_best = finished, True
        with self.detail("writes"):  # handing the files over, and the wait for them where the run waits
            self.writer.submit(self.last, last, strip=strip_last)
            if kept:  # a resumable checkpoint of its own, as last.pt is at that epoch
                self.writer.submit(self.last.with_name(f"epoch{epoch + 1}.pt"), last, strip=strip_last)
            if best is not None:
                self.held_best = None
                self.writer.submit(self.best, best, strip=strip_best)
            else:
                self._submit_held_best()
            if must:
                self.writer.drain()
        self.cadence.wrote(started)
        self.handed_over_at = self.writer.write_seconds

    def judged(self, improved: bool, fields: dict[str, Any]) -> None:
        """The candidate's epoch was judged: when it ``improved``, it becomes the held best.pt with ``fields``
        (its metrics and the best fitness, unknown when it was taken) set; otherwise it is dropped."""
        candidate, self.candidate = self.candidate, None
        if improved and candidate is not None:
            self.held_best = {**candidate, **fields}

    def best_state(self) -> dict[str, Any] | None:
        """What best.pt holds, or will once written: the held improvement, else the file (after the writer has
        written what it was given); None where there is none yet."""
        if self.held_best is not None:
            return self.held_best
        self.writer.drain()
        try:
            return load_checkpoint(self.best) if self.best.is_file() else None
        except CheckpointError as error:  # a resumed run's damaged best.pt (resume skips it too): not worth the run
            self.log(f"warning: {error}; the final report is the last epoch's")
            return None

    def close(self) -> None:
        """Write a held best.pt, then every pending file; raise the writer's error, if any."""
        try:
            self._submit_held_best()
        finally:
            self.writer.close()

    def _submit_held_best(self) -> None:
        if self.held_best is not None:
            held, self.held_best = self.held_best, None
            self.writer.submit(self.best, encode_checkpoint(held, self.best) if self.serialise_here else held)

    def _say_once(self) -> None:
        if not self.said_so:
            self.said_so = True
            self.log(f"checkpoints: epochs are short against a {self.cadence.cost:.2f} s write, so last.pt is written "
                     f"every {self.cadence.cost / self.cadence.share:.0f} s or so (at most {self.cadence.share:.0%} "
                     f"of the run), and at the end, a stop or a Ctrl-C; best.pt keeps every improvement")
