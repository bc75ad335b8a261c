"""Where a run's wall clock went: start-up, training, validation, checkpoints, final evaluation, other.

The account is always in exactly one part; the trainer switches it at phase boundaries (:meth:`TimeAccount.phase`
for a block, :meth:`TimeAccount.switch` for good), so the parts always sum to the wall clock. Phases nest: the
innermost one is charged (validation inside an epoch's bookkeeping counts as validation, once). Details (the
data scan inside start-up, the AMP check, the ``--time`` probe; what checkpoints spent building the state, copying it
out and waiting for the GPU) are measured beside their part, not added to it. So is Python's garbage collection,
charged to the part it interrupted (:meth:`TimeAccount.watch_collections`): a full pass over a run's live objects
takes a second or more, wherever an allocation happens to trigger it.

At the end of a run the account is printed as a table and written to ``time.json`` in the run folder (a resumed
run's keeps the earlier processes' accounts beside its own: :meth:`TimeAccount.save`)::

    time account (wall 30.7 s)
      start-up           4.1 s  13.4%   (imports 2.0 s, data 0.6 s, AMP check 0.9 s)
      training          19.5 s  63.5%
      ...
      (garbage collection 0.4 s: training 0.1 s, checkpoints 0.3 s)

Measured with ``time.perf_counter`` (resolution well under a microsecond on Linux); the process's own start
(interpreter and imports, before the trainer exists) comes from ``/proc`` with the kernel's clock-tick
resolution (10 ms), and is 0 where ``/proc`` is missing or the trainer was not started by a command.
"""

from __future__ import annotations

import gc
import json
import os
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from detector.files import write_text_atomically

# The parts of a run, in the order the table lists them; "other" is everything between the named phases
# (results.csv, plots, re-planning, the loader between epochs).
PARTS = ("start-up", "training", "validation", "checkpoints", "final evaluation", "other")


def process_age() -> float:
    """Seconds since this process started (Linux ``/proc``; 0.0 where that cannot be read).

    ``/proc/self/stat`` field 22 is the start time in clock ticks since boot, on the clock ``CLOCK_BOOTTIME``
    reads (the one ``/proc/uptime`` shows).
    """
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 overall; the name and state come first
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


class TimeAccount:
    """Seconds per part of a run: the account is always in exactly one part, and phases switch it.

    It starts in "start-up"; :meth:`phase` charges a block to a part and returns to the part it interrupted, and
    :meth:`switch` moves on for good (the trainer's fit switches to "other" once start-up is over). So every
    second between the account's start and now is charged to exactly one part: the parts sum to the wall clock.

    Args:
        before: seconds the process spent before the account existed (interpreter start, imports); charged to
            start-up and counted in the wall clock.
        clock: a monotonic clock in seconds (tests pass a fake one).
    """

    def __init__(self, *, before: float = 0.0, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.started = clock() - before
        self.seconds = dict.fromkeys(PARTS, 0.0)
        self.details: dict[str, dict[str, float]] = {part: {} for part in PARTS}
        if before:
            self.details["start-up"]["imports"] = before
        self.background: dict[str, float] = {}
        self.collections = dict.fromkeys(PARTS, 0.0)  # garbage collection's seconds, by the part it interrupted
        self._collection_began: float | None = None
        self.current, self._since = "start-up", self.started

    def switch(self, part: str) -> str:
        """Charge the time since the last switch to the current part and continue in ``part``; -> the old part."""
        if part not in self.seconds:
            raise ValueError(f"unknown part {part!r}; expected one of {PARTS}")
        now = self.clock()
        previous = self.current
        self.seconds[previous] += now - self._since
        self.current, self._since = part, now
        return previous

    @contextmanager
    def phase(self, part: str) -> Iterator[None]:
        """Charge the block to ``part``, then return to the part it interrupted (phases nest)."""
        previous = self.switch(part)
        try:
            yield
        finally:
            self.switch(previous)

    @contextmanager
    def detail(self, name: str) -> Iterator[None]:
        """Measure a detail of the current part (shown beside it; it changes no part's total)."""
        details, start = self.details[self.current], self.clock()
        try:
            yield
        finally:
            details[name] = details.get(name, 0.0) + self.clock() - start

    def watch_collections(self) -> None:
        """Time every garbage collection from now until :meth:`close` or another account watches (a collection on any
        thread holds the interpreter, so the part under way waits for it). One callback serves the process
        (``gc.callbacks``), holding the account weakly: a run that never closes its account leaves nothing behind."""
        global _watched
        _watched = weakref.ref(self)
        if _on_collection not in gc.callbacks:
            gc.callbacks.append(_on_collection)

    def close(self) -> None:
        """Stop timing garbage collections (the account keeps what it measured)."""
        global _watched
        if _watched is not None and _watched() is self:
            _watched = None

    def _on_collection(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._collection_began = self.clock()
        elif self._collection_began is not None:
            self.collections[self.current] += self.clock() - self._collection_began
            self._collection_began = None

    def totals(self) -> dict[str, float]:
        """``{"wall", each part}`` in seconds, as of now; the parts sum to "wall" (the current part counts up to now)."""
        now = self.clock()
        parts = dict(self.seconds)
        parts[self.current] += now - self._since
        return {"wall": now - self.started, **parts}

    def table(self, totals: dict[str, float] | None = None) -> str:
        """The account as a few aligned lines, for the end of a run."""
        totals = totals or self.totals()
        wall = totals["wall"]
        lines = [f"time account (wall {wall:.1f} s)"]
        for name in PARTS:
            share = 100 * totals[name] / wall if wall > 0 else 0.0
            line = f"  {name:<17} {totals[name]:8.1f} s {share:5.1f}%"
            if self.details[name]:
                line += "   (" + ", ".join(f"{key} {value:.1f} s" for key, value in self.details[name].items()) + ")"
            lines.append(line)
        collected = sum(self.collections.values())
        if collected >= 0.05:
            parts = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.collections.items()
                              if seconds >= 0.05)
            # Spread thin, no part's share reaches the table's 0.1 s: say so, not "start-up 0.0 s, training 0.0 s".
            lines.append(f"  (garbage collection {collected:.1f} s" + (f": {parts})" if parts else
                                                                       ", under 0.05 s in each part)"))
        for name, seconds in self.background.items():
            lines.append(f"  ({name}: {seconds:.1f} s on the writer thread, overlapped with the run)")
        return "\n".join(lines)

    def save(self, path: Path, totals: dict[str, float] | None = None) -> dict[str, float]:
        """Write ``{"seconds": totals, "details": {part: ...}, "start-up details": ..., "background": ...,
        "garbage collection": {part: seconds}}`` as JSON, atomically ("start-up details" as before "details").

        A resumed run's folder already has the account of the process before (each process of a run accounts for
        its own wall clock): that one and those it kept go to ``"earlier processes"``, oldest first, each in the
        same form, so the file's top level stays this process's (what its table printed) and no account is lost.
        """
        totals = totals or self.totals()
        document = {"seconds": totals, "details": self.details, "start-up details": self.details["start-up"],
                    "background": self.background, "garbage collection": self.collections}
        if earlier := _earlier_processes(path):
            document["earlier processes"] = earlier
        write_text_atomically(path, json.dumps(document, indent=2) + "\n")
        return totals


def _earlier_processes(path: Path) -> list[dict]:
    """The accounts an existing ``time.json`` holds, oldest first; none where there is no readable one (written
    atomically, a file is whole or absent, but a hand-edited one is not ours to refuse a run over)."""
    try:
        previous = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(previous, dict) or "seconds" not in previous:
        return []
    earlier = previous.pop("earlier processes", [])
    return [*(earlier if isinstance(earlier, list) else []), previous]


_watched: weakref.ref[TimeAccount] | None = None  # the account timing garbage collections (watch_collections)


def _on_collection(phase: str, info: dict) -> None:
    account = _watched() if _watched is not None else None
    if account is not None:
        account._on_collection(phase, info)
