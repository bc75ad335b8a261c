"""Training time budgets (``--time 8m``): parse a duration and fit the epoch plan to it.

Pure Python, no torch: the trainer measures, this module decides. The trainer calls
``TimeBudget.fit(...)`` before the first step, with estimates from a short timed probe (detector/training/probe.py),
and again after every epoch with what it has measured; each call returns an :class:`EpochPlan` (total
epochs, close-mosaic, warm-up epochs) that keeps the run, its final evaluation and its checkpoints inside
the budget. The learning-rate schedule follows a re-plan without a jump (detector/training/schedule.py)::

    budget = TimeBudget.parse("8m")
    plan = budget.fit(RunSoFar(elapsed_seconds=12.0, epoch_seconds=[31.0], val_seconds=[4.0], epochs_done=1),
                      RunSettings(epochs=20, close_mosaic=10, warmup_epochs=3.0, final_seconds=6.0))
    print(plan.describe())  # time budget 8m: 13 epochs fit at ~31 s each (+4 s val), close-mosaic 6, ...

``plan.epochs == epochs_done`` means: no further epoch fits, finish now (final evaluation, checkpoints).
"""

from __future__ import annotations

import math
import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["EpochPlan", "RunClock", "RunSettings", "RunSoFar", "TimeBudget", "format_duration", "parse_duration",
           "report_seconds"]

_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_DURATION = re.compile(
    rf"^(?:(?P<h>{_NUMBER})h)?(?:(?P<m>{_NUMBER})m(?:in)?)?(?:(?P<s>{_NUMBER})s)?$", re.IGNORECASE
)
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0}


def parse_duration(value: str | float) -> float:
    """Seconds in a ``--time`` value: ``"8m"``, ``"1.5h"``, ``"90s"``, ``"1h30m"``, ``"45m30s"``.

    A bare number is hours, as in Ultralytics' ``time=`` argument (``"0.5"`` and ``0.5`` are 30 minutes).
    Units are ``h``, ``m`` (or ``min``) and ``s``, largest first, each at most once; spaces are ignored.
    Raises ``ValueError`` naming ``--time`` for anything else, and for a duration that is not positive.
    """
    if isinstance(value, bool):
        raise ValueError(f"--time: expected a duration such as 8m, 1.5h, 90s or 45m30s, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value) * 3600.0
    else:
        text = "".join(str(value).split())
        try:
            seconds = float(text) * 3600.0 if re.fullmatch(_NUMBER, text) else _parse_units(text)
        except ValueError:
            raise ValueError(
                f"--time: expected a duration such as 8m, 1.5h, 90s or 45m30s (a bare number is hours), "
                f"got {value!r}"
            ) from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"--time must be a positive duration, got {value!r}")
    return seconds


def _parse_units(text: str) -> float:
    match = _DURATION.match(text)
    if not text or match is None or not any(match.groupdict().values()):
        raise ValueError(text)
    return sum(float(amount) * _UNIT_SECONDS[unit] for unit, amount in match.groupdict().items() if amount)


def format_duration(seconds: float) -> str:
    """Short human form of a duration: ``"90s" -> "1m30s"``, ``5400 -> "1h30m"``, ``480 -> "8m"``."""
    total = round(seconds)
    if total < 60:
        return f"{seconds:.3g}s" if seconds < 10 else f"{total}s"
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{hours}h" if hours else "", f"{minutes}m" if minutes else "", f"{secs}s" if secs else ""]
    return "".join(parts)


def seconds_text(seconds: float) -> str:
    """A plan's figure in seconds: whole seconds from 1 s on, two significant digits below (a short epoch's "~0 s
    each (+0 s val)" said nothing): ``31``, ``5``, ``0.3``, ``0.04``."""
    return f"{seconds:.0f}" if seconds >= 1 else f"{seconds:.2g}"


# The warm-up takes at most this share of the run's steps (detector.training.builders.warmup_steps). Without a cap,
# "3 epochs, at least 100 steps" was the whole of a short run: 2 epochs of 4,096 images at batch 64 (128 steps)
# never left it, and the decay towards the final rate ran at the same time, so the learning rate never got above a
# sixth of lr0. mAP50-95 after those 2 epochs (synthetic shapes at 160 px, CPU): 0.024 uncapped, 0.434 with this
# cap, Ultralytics 0.199; BCCD, 10 epochs at 320 (130 steps), seeds 0 and 1: 0.100 / 0.156 uncapped, 0.214 / 0.160
# capped. Runs of 12 epochs or more and 400 steps or more are unchanged.
MAX_WARMUP_SHARE = 0.25
# ... and at least this many steps, before the cap: our choice. Ultralytics up to 8.3 took max(round(warmup_epochs *
# nb), 100); 8.4 takes round(min(warmup_epochs, epochs - 1) * nb), no floor. Kept on a small A/B (docs/training.md
# "Optimizer and warm-up": 64 shapes images, 80 epochs, two seeds, better with it), a hint rather than a proof.
MIN_WARMUP_STEPS = 100


@dataclass(frozen=True)
class EpochPlan:
    """What fits in the budget. ``epochs`` is the run's total (done + still to run), not what is left.

    ``close_mosaic`` and ``warmup_epochs`` replace the configured values for the rest of the run; the
    estimates (seconds) are the ones the plan was made from, for the log line. Keep the trainer's
    100-step warm-up floor on top of the scaled ``warmup_epochs``: on the built-in dataset a 4-epoch run
    lost mAP50-95 with a shorter warm-up (0.215 at 100 steps, 0.126 at 32, 0.037 without; issue 14: single
    runs, within the seed spread of runs that short). The trainer caps both at a quarter of the run
    (:data:`MAX_WARMUP_SHARE`), which later measurements favoured by far more; :meth:`describe` says the capped one.
    ``over_budget`` is true when even the minimum (one epoch, or the epochs already done) does not fit:
    the caller should warn.
    """

    epochs: int
    close_mosaic: int
    warmup_epochs: float
    budget_seconds: float
    epoch_seconds: float | None
    val_seconds: float
    measured: bool
    over_budget: bool = False
    budget_text: str = ""

    def describe(self, *, warmup_epochs: float | None = None) -> str:
        """One line for the run header / the log after a re-fit. ``warmup_epochs``: the warm-up the schedule gets (its
        steps over the steps per epoch: the trainer's 100-step floor can make it longer than the plan's, and a warm-up
        under way is not rescaled); without it, the plan's, capped at a quarter of the run."""
        if warmup_epochs is None:
            warmup_epochs = min(self.warmup_epochs, MAX_WARMUP_SHARE * self.epochs)
        budget = self.budget_text or format_duration(self.budget_seconds)
        if self.epoch_seconds is None:
            return (f"time budget {budget}: epoch time not measured yet, planning {self.epochs} epochs "
                    f"until the first one is timed")
        estimated = "" if self.measured else " (estimated from timed steps; re-fitted after every epoch)"
        val = f" (+{seconds_text(self.val_seconds)} s val)" if self.val_seconds > 0 else ""
        line = (f"time budget {budget}: {self.epochs} epoch{'s' if self.epochs != 1 else ''} fit at "
                f"~{seconds_text(self.epoch_seconds)} s each{val}, close-mosaic {self.close_mosaic}, "
                f"warm-up {warmup_epochs:.2g} epochs")
        if self.over_budget:
            line += " (over budget: the budget is smaller than the minimum run)"
        return line + estimated


@dataclass(frozen=True)
class RunSoFar:
    """What a run has spent and done when it asks for a plan.

    Attributes:
        elapsed_seconds: wall time since the budget's clock started (the process start: it includes set-up, data
            caching and the AMP check, which happen before the first epoch).
        epoch_seconds: seconds of each completed epoch but its validation: the wall time from its start to the next
            epoch's start (checkpoint writes and plots included) less ``val_seconds``. Used only to predict future
            epochs, from their running median.
        val_seconds: validation seconds of completed epochs; ``None``/NaN for epochs without one.
        epochs_done: epochs completed so far. The plan never shrinks below this.
        warmup_started: the run has taken its first step: the warm-up is returned as given, not rescaled (a
            warm-up changed mid-ramp would move the next step's LR; detector/training/schedule.py).
        mosaic_closed_at: the epoch at which mosaic was already turned off, if it was: it stays off (a longer
            fitted run must not turn it back on).
    """

    elapsed_seconds: float
    epoch_seconds: Sequence[float] = ()
    val_seconds: Sequence[float | None] = ()
    epochs_done: int = 0
    warmup_started: bool = False
    mosaic_closed_at: int | None = None


@dataclass(frozen=True)
class RunSettings:
    """The configuration a plan scales: close-mosaic and warm-up keep the same fraction of the fitted run as of
    the configured one.

    Attributes:
        epochs: the configured epoch count.
        close_mosaic, warmup_epochs: as configured (``warmup_epochs``: the current warm-up once it has started).
        val_interval: the run validates every this many epochs, and always after the last.
        final_seconds: expected extra cost of the end of the run on top of an ordinary validation (final plots,
            predictions.json, an FP32 re-evaluation).
        max_epochs: an upper bound on the fitted total, if the caller wants one.
    """

    epochs: int
    close_mosaic: int
    warmup_epochs: float
    val_interval: int = 1
    final_seconds: float = 0.0
    max_epochs: int | None = None


@dataclass(frozen=True)
class TimeBudget:
    """A wall-clock budget for a whole run: set-up, AMP check, epochs, validation, final evaluation, saves.

    ``safety`` is the fraction of the *remaining* time held back, because the remaining epochs are
    predicted from past ones and the prediction errs by a few percent (multi-scale draws different sizes
    each epoch, a shared CPU's speed changes, the data cache warms up). It is a fraction of what is left,
    not of the whole budget, because time already spent is known exactly; re-fitting every epoch keeps
    the error to a few epochs' worth. ``epoch_jitter`` is held back once more, as a fraction of one
    epoch: the last epoch cannot be stopped halfway without losing it, so it must fit even when it runs
    that much slower than the estimate (or as much slower as an epoch has already been seen to run).
    """

    seconds: float
    text: str = ""
    safety: float = 0.05
    epoch_jitter: float = 0.10

    def __post_init__(self) -> None:
        if not (math.isfinite(self.seconds) and self.seconds > 0):
            raise ValueError(f"--time must be a positive duration, got {self.seconds!r} s")
        if not (0 <= self.safety < 1 and self.epoch_jitter >= 0):
            raise ValueError(f"safety must be in [0, 1) and epoch_jitter >= 0 (got {self.safety}, {self.epoch_jitter})")

    @classmethod
    def parse(cls, value: str | float, **margins: float) -> TimeBudget:
        """``TimeBudget.parse("8m")``; see :func:`parse_duration` for the forms accepted."""
        text = value.strip() if isinstance(value, str) else format_duration(parse_duration(value))
        if re.fullmatch(_NUMBER, text):  # a bare number is hours: the plan's line says so ("0.01h", not "0.01")
            text += "h"
        return cls(parse_duration(value), text=text, **margins)

    def fit(
        self,
        so_far: RunSoFar,
        settings: RunSettings,
        *,
        prior_epoch_seconds: float | None = None,
        prior_val_seconds: float | None = None,
    ) -> EpochPlan:
        """Plan the run so that it ends, final evaluation and checkpoints included, inside the budget.

        Args:
            so_far: what the run has spent and done (see :class:`RunSoFar`).
            settings: the configuration the plan scales (see :class:`RunSettings`).
            prior_epoch_seconds: an estimate of one epoch's seconds without validation, used until an epoch is
                measured (a few timed steps x steps per epoch). Without it and without measurements the
                configured epoch count is kept. Plans from estimates are marked ``measured=False``.
            prior_val_seconds: an estimate of one validation's seconds, used until one is measured.
        """
        elapsed_seconds, epoch_seconds, val_seconds = so_far.elapsed_seconds, so_far.epoch_seconds, so_far.val_seconds
        epochs_done, configured_epochs = so_far.epochs_done, settings.epochs
        val_interval, final_seconds = settings.val_interval, settings.final_seconds
        if configured_epochs < 1 or epochs_done < 0 or val_interval < 1:
            raise ValueError("configured_epochs and val_interval must be >= 1 and epochs_done >= 0")
        train_estimate = _running_estimate(epoch_seconds)
        measured = train_estimate is not None
        if train_estimate is None:
            train_estimate = prior_epoch_seconds
        val_estimate = _running_estimate([v for v in val_seconds if v is not None and math.isfinite(v)])
        if val_estimate is None:
            val_estimate = prior_val_seconds or 0.0
        over_budget = False
        if train_estimate is None:
            epochs = max(configured_epochs, epochs_done + 1)
        else:
            epoch_cost = max(train_estimate, 1e-6)
            remaining = self.seconds - elapsed_seconds
            last_epoch_reserve = max(self.epoch_jitter * (epoch_cost + val_estimate), _spread(epoch_seconds))
            usable = remaining - self.safety * max(remaining, 0.0) - last_epoch_reserve

            def cost(extra: int) -> float:  # seconds for `extra` more epochs and the end of the run
                total = epochs_done + extra
                if extra == 0:  # stopping now: the last done epoch needs its validation if it skipped one
                    validations = 1 if epochs_done and epochs_done % val_interval else 0
                else:
                    validations = total // val_interval - epochs_done // val_interval
                    validations += 1 if total % val_interval else 0  # the last epoch always validates
                return extra * epoch_cost + validations * val_estimate + final_seconds

            extra = _largest_fitting(cost, usable, upper=int(max(usable, 0) // epoch_cost) + 1)
            epochs = max(epochs_done + extra, 1)
            # Over budget: even the minimum run (one epoch, or stopping now) does not fit. The end-of-run allowance is
            # not part of that: an estimate held back, whose not fitting said "over budget" of a 12-s run that then
            # ended at 6.9 s.
            over_budget = extra == 0 and cost(epochs - epochs_done) - final_seconds > usable
        if settings.max_epochs is not None:
            epochs = max(min(epochs, settings.max_epochs), epochs_done, 1)
        return EpochPlan(
            epochs=epochs,
            close_mosaic=_fit_close_mosaic(settings.close_mosaic, configured_epochs, epochs, so_far.mosaic_closed_at),
            warmup_epochs=(settings.warmup_epochs if so_far.warmup_started
                           else settings.warmup_epochs * epochs / configured_epochs),
            budget_seconds=self.seconds,
            epoch_seconds=train_estimate,
            val_seconds=val_estimate,
            measured=measured,
            over_budget=over_budget,
            budget_text=self.text,
        )



# The final report beyond one more validation: its matplotlib figures (PR curves, the confusion matrix in counts and
# normalised, results.png; the prediction images are OpenCV's, far cheaper) at what a figure has been timed at on this
# host (labels.png, drawn before the first step, then each results.png), and a floor for the rest (per-class table, predictions.json, the prediction
# images). Before, a fixed 10 s, while the whole report took 0.6-0.9 s on an idle CPU: a --time 12s run planned one
# epoch of 0.3 s and ended at 6.9 s, and --time 40s left 22% unused.
REPORT_FIGURES = 4
# Until a figure is timed: matplotlib's 0.6-0.9 s per figure on a 2-core CPU, rounded up.
UNTIMED_FIGURE_SECONDS = 1.0
# Twice the figures' time: the host can slow after a figure was timed (the review's run with 4 busy loops started
# after the probe: 4.4 s at its end, against ~0.7 s idle, of which the figures are under half).
REPORT_MARGIN = 2.0
# The report's floor: the review's whole end of run took 0.6-0.9 s on an idle CPU, figures included.
REPORT_FLOOR_SECONDS = 1.0


def report_seconds(figure_seconds: float | None) -> float:
    """What the final report's plots are planned to take, from what one figure took (None: not timed yet)."""
    figure = UNTIMED_FIGURE_SECONDS if figure_seconds is None else figure_seconds
    return max(REPORT_FLOOR_SECONDS, REPORT_MARGIN * REPORT_FIGURES * figure)


class RunClock:
    """A run's clock and what its epochs cost, kept by rank 0: the ``--time`` bookkeeping in one place.

    Per epoch it keeps the wall time from the epoch's start to the next epoch's start less its validation (so
    checkpoint writes and plots count) and the validation's seconds. The epoch ends with the re-plan; what
    follows it (results row, plots, checkpoints) is the epoch's *tail*, measured when the next epoch starts
    and counted with the next re-plan, so the sum over epochs is the wall time between epoch starts. Without
    ``--time`` (``budget`` None) the clock still runs: a checkpoint saves it, and a resumed budget covers the
    whole run (each process's start-up included).
    """

    def __init__(self, budget: TimeBudget | None = None, *, before: float = 0.0) -> None:
        self.budget = budget
        # set-up, the AMP check and evaluation count too; ``before``: seconds the process spent before the clock
        # existed (a command's interpreter start and imports: 1.5-3 s, which --time 12s overran by)
        self.start = time.monotonic() - before
        self.epoch_seconds: list[float] = []
        self.val_seconds: list[float | None] = []
        self.prior_val_seconds: float | None = None  # the probe's estimate, until a validation is timed
        self._epoch_started: float | None = None
        self._replanned_at: float | None = None
        self._tail = 0.0

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def epoch_starts(self) -> None:
        now = time.monotonic()
        if self._replanned_at is not None:
            self._tail = now - self._replanned_at
        self._epoch_started = now

    def epoch_ends(self, val_seconds: float | None) -> None:
        """Record the epoch that just trained (and its validation, None if it had none)."""
        assert self._epoch_started is not None, "epoch_starts() first"
        self.val_seconds.append(val_seconds)
        self.epoch_seconds.append(time.monotonic() - self._epoch_started - (val_seconds or 0.0) + self._tail)

    def replanned(self) -> None:
        self._replanned_at = time.monotonic()

    def final_seconds(self, *, report: bool, fp32_again: bool, figure_seconds: float | None = None) -> float:
        """What the end of the run costs beyond the last epoch's validation: best.pt's pass (the final report's,
        where an earlier epoch was the best: whether it will be is not known before the last epoch, so it is
        always planned; the slowest validation so far), the report's plots (:func:`report_seconds`, from
        ``figure_seconds``, the slowest figure timed so far), and a ``--final-fp32`` evaluation (FP32 runs at about
        half the reduced-precision speed, so twice the slowest validation)."""
        measured = [seconds for seconds in self.val_seconds if seconds is not None] or [self.prior_val_seconds or 0.0]
        slowest = max(measured)
        return slowest + (report_seconds(figure_seconds) if report else 0.0) + (2 * slowest if fp32_again else 0.0)

    def refit(self, settings: RunSettings, *, epochs_done: int, mosaic_closed_at: int | None) -> EpochPlan | None:
        """The plan for the rest of the run after ``epochs_done`` epochs; None without a budget."""
        if self.budget is None:
            return None
        # This epoch's checkpoints and plots are still to come: counted as already spent, as long as the last.
        so_far = RunSoFar(self.elapsed() + self._tail, self.epoch_seconds, self.val_seconds, epochs_done,
                          warmup_started=True, mosaic_closed_at=mosaic_closed_at)
        return self.budget.fit(so_far, settings, prior_val_seconds=self.prior_val_seconds)

    def restore(self, time_spent: float, epoch_seconds: list[float], val_seconds: list[float | None]) -> None:
        """Continue a resumed run's clock: the budget covers the whole run, before and after."""
        self.start -= time_spent
        self.epoch_seconds, self.val_seconds = list(epoch_seconds), list(val_seconds)


def _running_estimate(samples: Sequence[float]) -> float | None:
    """Seconds per epoch to plan with: the larger of the median of all and of the last three samples.

    The median ignores one slow outlier (the first epoch pays for worker start-up and the allocator
    warming up; one epoch may draw large multi-scale sizes); the recent median follows a machine that
    has become slower (another job started) without waiting for half the history to agree.
    """
    values = [float(s) for s in samples if s is not None and math.isfinite(s) and s >= 0]
    if not values:
        return None
    return max(statistics.median(values), statistics.median(values[-3:]))


def _spread(samples: Sequence[float]) -> float:
    """How much slower than the median an epoch has run (the first epoch's one-time costs left out).

    On a shared CPU epochs vary by +/-30% (measured: 36-69 s for the same 20-epoch run); the last epoch
    must fit even when it is one of the slow ones, so the reserve follows the observed spread.
    """
    values = [float(s) for s in samples[1:] if s is not None and math.isfinite(s)]
    return max(values) - statistics.median(values) if len(values) >= 2 else 0.0


def _largest_fitting(cost: Callable[[int], float], usable: float, *, upper: int) -> int:
    """Largest ``k`` in ``[0, upper]`` with ``cost(k) <= usable`` (cost is non-decreasing); 0 if none."""
    low, high = 0, max(upper, 0)
    while low < high:
        middle = (low + high + 1) // 2
        if cost(middle) <= usable:
            low = middle
        else:
            high = middle - 1
    return low


def _fit_close_mosaic(close_mosaic: int, configured_epochs: int, epochs: int, closed_at: int | None) -> int:
    """Same fraction of the run without mosaic as configured; at least 1 epoch if it was on at all."""
    if closed_at is not None:
        return max(epochs - closed_at, 0)
    if close_mosaic <= 0:
        return 0
    if close_mosaic >= configured_epochs:
        return epochs  # configured with mosaic off throughout: keep it off
    return min(max(round(close_mosaic * epochs / configured_epochs), 1), epochs)
