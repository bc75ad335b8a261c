"""``--time`` budgets: parsing durations and fitting the epoch plan (pure: no torch, no training)."""

from __future__ import annotations

import random

import pytest

from detector.training.budget import (MAX_WARMUP_SHARE, REPORT_FLOOR_SECONDS, EpochPlan, RunClock, RunSettings,
                                      RunSoFar, TimeBudget, format_duration, parse_duration, report_seconds)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("8m", 480), ("1.5h", 5400), ("90s", 90), ("45m30s", 2730), ("1h30m", 5400), ("2h5m10s", 7510),
        ("8min", 480), (" 8 m ", 480), ("0.5", 1800), ("2", 7200), (0.25, 900), (1, 3600), (".5h", 1800),
        ("1H", 3600),
    ],
)
def test_parse_duration_accepts_units_and_bare_hours(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "abc", "8x", "m", "5s3m", "-8m", "1h1h", "8 minutes", "inf", "nan", True])
def test_parse_duration_rejects_bad_input_naming_the_flag(text: object) -> None:
    with pytest.raises(ValueError, match="--time"):
        parse_duration(text)  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["0", "0m", "0h0m0s", 0, -1.0])
def test_parse_duration_rejects_non_positive(text: str | float) -> None:
    with pytest.raises(ValueError, match="--time must be a positive duration"):
        parse_duration(text)


@pytest.mark.parametrize(("seconds", "text"), [(480, "8m"), (5400, "1h30m"), (90, "1m30s"), (45, "45s"), (3600, "1h")])
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == seconds


SO_FAR = {"elapsed_seconds", "epoch_seconds", "val_seconds", "epochs_done", "warmup_started", "mosaic_closed_at"}
PRIORS = {"prior_epoch_seconds", "prior_val_seconds"}


def fit_plan(budget: TimeBudget, **arguments: object) -> EpochPlan:
    """``budget.fit`` with every argument named flat: what the run has done, the settings, the priors."""
    so_far = RunSoFar(**{k: v for k, v in arguments.items() if k in SO_FAR})  # type: ignore[arg-type]
    settings = {("epochs" if k == "configured_epochs" else k): v for k, v in arguments.items()
                if k not in SO_FAR | PRIORS}
    priors = {k: v for k, v in arguments.items() if k in PRIORS}
    return budget.fit(so_far, RunSettings(**settings), **priors)  # type: ignore[arg-type]


def fit(budget: str | float, **overrides: object) -> EpochPlan:
    arguments: dict[str, object] = dict(
        elapsed_seconds=20.0, epoch_seconds=[30.0], val_seconds=[5.0], epochs_done=1,
        configured_epochs=20, close_mosaic=10, warmup_epochs=3.0, final_seconds=5.0,
    )
    arguments.update(overrides)
    return fit_plan(TimeBudget.parse(budget), **arguments)


def planned_seconds(plan: EpochPlan, *, elapsed: float, done: int, train: float, val: float, final: float) -> float:
    return elapsed + (plan.epochs - done) * (train + val) + final


def test_fit_eight_minutes_and_header_line() -> None:
    plan = fit("8m")
    # 480 s - 20 spent = 460; less 5% (23) and 10% of an epoch (3.5) and the final 5 s: 428.5 / 35 = 12 more.
    assert plan.epochs == 13
    assert plan.close_mosaic == round(10 * 13 / 20)  # same half of the run as configured
    assert plan.warmup_epochs == pytest.approx(3.0 * 13 / 20)
    assert plan.measured and not plan.over_budget
    assert planned_seconds(plan, elapsed=20, done=1, train=30, val=5, final=5) <= 480
    assert plan.describe() == (
        "time budget 8m: 13 epochs fit at ~30 s each (+5 s val), close-mosaic 6, warm-up 1.9 epochs"
    )
    # Sub-second figures keep two digits: a short epoch's line said "~0 s each (+0 s val)".
    short = fit("20s", elapsed_seconds=2.0, epoch_seconds=[0.3], val_seconds=[0.04], epochs_done=1)
    assert "fit at ~0.3 s each (+0.04 s val)" in short.describe()


def test_fit_before_any_measurement_keeps_configured_epochs_or_uses_the_prior() -> None:
    unmeasured = fit("8m", elapsed_seconds=10.0, epoch_seconds=[], val_seconds=[], epochs_done=0)
    assert unmeasured.epochs == 20 and not unmeasured.measured
    assert "not measured yet" in unmeasured.describe()
    prior = fit("8m", elapsed_seconds=10.0, epoch_seconds=[], val_seconds=[], epochs_done=0, prior_epoch_seconds=90.0)
    assert prior.epochs == 4 and not prior.measured  # (480-10)*0.95 - 9 - 5 = 432.5 s at 90 s per epoch


def test_fp32_two_core_cpu_fits_about_four_epochs_in_eight_minutes() -> None:
    # The case of issue 14: ~85 s per epoch plus ~13 s of validation, ~25 s of set-up and AMP check.
    plan = fit("8m", elapsed_seconds=25 + 85 + 13, epoch_seconds=[85.0], val_seconds=[13.0], final_seconds=8.0)
    assert plan.epochs == 4
    assert plan.close_mosaic == 2 and plan.warmup_epochs == pytest.approx(0.6)
    assert planned_seconds(plan, elapsed=123, done=1, train=85, val=13, final=8) <= 480


def test_too_small_budget_still_runs_one_epoch_and_says_so() -> None:
    plan = fit("30s", elapsed_seconds=5.0, epoch_seconds=[], val_seconds=[], epochs_done=0, prior_epoch_seconds=60.0)
    assert plan.epochs == 1 and plan.over_budget
    assert plan.close_mosaic == 1  # was on for half the run: at least one epoch
    assert "over budget" in plan.describe()


def test_budget_spent_means_stop_now_never_below_epochs_done() -> None:
    plan = fit("8m", elapsed_seconds=470.0, epoch_seconds=[30.0] * 12, val_seconds=[5.0] * 12, epochs_done=12)
    assert plan.epochs == 12  # no further epoch fits: finish with what is done
    overspent = fit("8m", elapsed_seconds=600.0, epoch_seconds=[30.0] * 15, val_seconds=[5.0] * 15, epochs_done=15)
    assert overspent.epochs == 15 and overspent.over_budget


def test_fit_is_monotonic_in_the_budget() -> None:
    epochs = [fit(seconds / 3600).epochs for seconds in range(30, 4000, 7)]
    assert epochs == sorted(epochs)
    assert epochs[0] == 1 and epochs[-1] > 100


@pytest.mark.parametrize("train", [0.5, 3.0, 31.0, 85.0, 400.0])
@pytest.mark.parametrize("budget", [60.0, 480.0, 5400.0])
@pytest.mark.parametrize("val_interval", [1, 3])
def test_never_exceeds_the_budget_with_the_measured_times(train: float, budget: float, val_interval: int) -> None:
    val, final, done = 0.2 * train, 0.1 * train, 1
    elapsed = 0.05 * budget + train + val  # set-up, then the first epoch (validated: the estimate needs one)
    plan = fit_plan(
        TimeBudget(budget),
        elapsed_seconds=elapsed, epoch_seconds=[train], val_seconds=[val], epochs_done=done, configured_epochs=20,
        close_mosaic=10, warmup_epochs=3, final_seconds=final, val_interval=val_interval,
    )
    validations = sum(1 for epoch in range(2, plan.epochs + 1) if epoch % val_interval == 0 or epoch == plan.epochs)
    spent = elapsed + (plan.epochs - done) * train + validations * val + final
    assert spent <= budget or (plan.over_budget and plan.epochs == done)
    if not plan.over_budget:  # and not wastefully short: one more epoch would not have fit
        assert spent + train + val > budget - TimeBudget(budget).safety * (budget - elapsed) - 0.1 * (train + val)


@pytest.mark.parametrize("seed", range(5))
def test_refitting_every_epoch_with_noisy_times_ends_inside_the_budget(seed: int) -> None:
    generator = random.Random(seed)
    budget, clock, done, train_times, val_times = TimeBudget.parse("8m"), 25.0, 0, [], []
    plan = fit_plan(budget, elapsed_seconds=clock, epoch_seconds=[], val_seconds=[], epochs_done=0, configured_epochs=20,
                      close_mosaic=10, warmup_epochs=3, final_seconds=6, prior_epoch_seconds=None)
    first_epoch_extra = 8.0  # worker start-up and allocator warm-up: the first epoch is the slowest
    while done < plan.epochs:
        train_times.append(30.0 * generator.uniform(0.93, 1.07) + (first_epoch_extra if done == 0 else 0.0))
        val_times.append(5.0 * generator.uniform(0.9, 1.1))
        clock += train_times[-1] + val_times[-1]
        done += 1
        plan = fit_plan(budget, elapsed_seconds=clock, epoch_seconds=train_times, val_seconds=val_times, epochs_done=done,
                          configured_epochs=20, close_mosaic=10, warmup_epochs=3, final_seconds=6)
        assert plan.epochs >= done
    assert clock + 6 <= 480
    assert done >= 11  # 455 s of room at ~35 s per epoch: the margins cost at most a couple of epochs


def test_close_mosaic_fraction_and_edge_cases() -> None:
    assert fit("8m", close_mosaic=0).close_mosaic == 0
    assert fit("8m", close_mosaic=20).close_mosaic == fit("8m").epochs  # mosaic off throughout stays off
    assert fit("8m", close_mosaic=1).close_mosaic == 1  # 1/20 of 13 epochs rounds to 1 (at least one)
    # Mosaic already closed at epoch 5: a longer plan must not turn it back on.
    closed = fit("20m", epoch_seconds=[30.0] * 6, val_seconds=[5.0] * 6, epochs_done=6, elapsed_seconds=230,
                 mosaic_closed_at=5)
    assert closed.close_mosaic == closed.epochs - 5


def test_the_plan_line_says_the_warm_up_the_schedule_gets() -> None:
    """Configured for 1 epoch, fitted to 13: the warm-up scales to 39 epochs, three times the run; the schedule caps it
    at a quarter of the run (detector.training.builders.warmup_steps), and the plan's line says that, not 39."""
    plan = fit("8m", configured_epochs=1, warmup_epochs=3.0)
    assert plan.warmup_epochs > plan.epochs
    assert f"warm-up {MAX_WARMUP_SHARE * plan.epochs:.2g} epochs" in plan.describe()


def test_max_epochs_caps_the_plan() -> None:
    assert fit("1.5h", max_epochs=20).epochs == 20
    assert fit("1.5h", max_epochs=20).close_mosaic == 10


def test_running_estimate_ignores_a_slow_first_epoch_but_follows_a_slowdown() -> None:
    steady = fit("8m", epoch_seconds=[50.0, 30.0, 30.0, 30.0, 30.0], val_seconds=[5.0] * 5, epochs_done=5,
                 elapsed_seconds=200.0)
    assert steady.epoch_seconds == 30.0
    slower = fit("8m", epoch_seconds=[30.0, 30.0, 30.0, 30.0, 45.0, 45.0], val_seconds=[5.0] * 6, epochs_done=6,
                 elapsed_seconds=250.0)
    assert slower.epoch_seconds == 45.0


def test_skipped_validations_do_not_count() -> None:
    plan = fit("8m", epoch_seconds=[30.0, 30.0], val_seconds=[None, float("nan")], epochs_done=2, val_interval=3)
    assert plan.val_seconds == 0.0


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="--time"):
        TimeBudget(0)
    with pytest.raises(ValueError):
        fit("8m", configured_epochs=0)


def test_stopping_after_an_unvalidated_epoch_reserves_its_validation() -> None:
    common = dict(epoch_seconds=[30.0] * 4, val_seconds=[None, None, 5.0, None], epochs_done=4, val_interval=3,
                  final_seconds=5.0)
    # 9 s left, less 5% and a tenth of an epoch: 5.05 s. The validation fits (the allowance does not: no "over budget")
    assert fit("8m", elapsed_seconds=480 - 9.0, **common).epochs == 4
    assert fit("8m", elapsed_seconds=480 - 6.0, **common).over_budget  # 2.1 s: not even the 5-s validation fits
    assert not fit("8m", elapsed_seconds=480 - 16.0, **common).over_budget


@pytest.mark.parametrize("budget", ["8m", "12m", "15m", "20m"])
def test_replaying_a_shared_cpu_run_ends_inside_the_budget(budget: str) -> None:
    # Epoch seconds of a real 20-epoch run on a 2-core CPU shared with other jobs (first epoch: start-up).
    times = [92, 59, 68, 71, 61, 65, 59, 61, 69, 61, 52, 69, 46, 36, 43, 41, 51, 61, 57, 64]
    plan_budget, clock, done = TimeBudget.parse(budget), 25.0, 0
    common = dict(configured_epochs=20, close_mosaic=10, warmup_epochs=3.0, final_seconds=5.0)
    plan = fit_plan(plan_budget, elapsed_seconds=clock, epoch_seconds=[], val_seconds=[], epochs_done=0, **common)
    while done < plan.epochs:
        clock += times[done] + 6.0
        done += 1
        plan = fit_plan(plan_budget, elapsed_seconds=clock, epoch_seconds=times[:done], val_seconds=[6.0] * done,
                               epochs_done=done, **common)
    assert clock + 5.0 <= plan_budget.seconds
    assert clock + 5.0 + 2 * 66 > plan_budget.seconds  # within about two epochs of the budget: not wasteful


def test_fit_from_a_probe_before_the_first_step() -> None:
    # A probe timed 0.5 s per step; 60 steps per epoch -> 30 s of training, and 4 s of validation estimated.
    plan = fit("8m", elapsed_seconds=20.0, epoch_seconds=[], val_seconds=[], epochs_done=0,
               prior_epoch_seconds=0.5 * 60, prior_val_seconds=4.0)
    # 460 s left, less 5% (23) and 10% of an epoch (3.4) and the final 5 s: 428.6 / 34 = 12 epochs.
    assert plan.epochs == 12 and not plan.measured and not plan.over_budget
    assert plan.val_seconds == 4.0 and plan.warmup_epochs == pytest.approx(3.0 * 12 / 20)
    assert planned_seconds(plan, elapsed=20, done=0, train=30, val=4, final=5) <= 480
    assert plan.describe().endswith("(estimated from timed steps; re-fitted after every epoch)")
    # Once a validation is measured it replaces the estimate.
    measured = fit("8m", prior_val_seconds=4.0)
    assert measured.val_seconds == 5.0 and measured.measured


def test_a_started_warmup_keeps_its_length() -> None:
    assert fit("8m", warmup_epochs=1.2, warmup_started=True).warmup_epochs == 1.2
    assert fit("8m", warmup_epochs=1.2).warmup_epochs == pytest.approx(1.2 * 13 / 20)


def test_the_end_of_the_run_plans_best_pt_s_pass_the_report_and_an_fp32_pass() -> None:
    """After the last epoch's validation a run may validate once more (best.pt, where an earlier epoch was the best:
    not known in advance), plots its report, and with --final-fp32 evaluates at FP32's speed (twice the slowest)."""
    clock = RunClock()
    clock.prior_val_seconds = 2.0  # the probe's estimate, until a validation is timed
    assert clock.final_seconds(report=False, fp32_again=False) == 2.0
    clock.val_seconds = [3.0, None, 5.0, 4.0]  # None: an epoch without validation
    assert clock.final_seconds(report=False, fp32_again=False) == 5.0
    assert clock.final_seconds(report=True, fp32_again=False) == 5.0 + report_seconds(None)
    assert clock.final_seconds(report=True, fp32_again=True, figure_seconds=0.4) == 5.0 + report_seconds(0.4) + 2 * 5.0


def test_the_report_allowance_follows_what_a_figure_takes_here() -> None:
    """Three figures at twice their timed cost, at least the floor: no longer a fixed 10 s."""
    assert report_seconds(0.3) == pytest.approx(2 * 4 * 0.3) and report_seconds(1.5) == pytest.approx(12.0)
    assert report_seconds(0.01) == REPORT_FLOOR_SECONDS and report_seconds(None) == pytest.approx(8.0)


def test_a_short_budget_is_not_spent_on_the_report_allowance() -> None:
    """The review's --time 12s at 64 px: 5.6 s of start-up, epochs of 0.3 s, validations of 0.06 s, labels.png
    drawn in 0.3 s. The fixed 10-s allowance planned 1 epoch "over budget"; the run ended at 6.9 s."""
    clock = RunClock()
    clock.prior_val_seconds = 0.06
    final = clock.final_seconds(report=True, fp32_again=False, figure_seconds=0.3)
    plan = fit(12.0 / 3600, elapsed_seconds=5.6, epoch_seconds=[], val_seconds=[], epochs_done=0,
               prior_epoch_seconds=0.3, prior_val_seconds=0.06, final_seconds=final)
    assert plan.epochs >= 5 and not plan.over_budget
    assert planned_seconds(plan, elapsed=5.6, done=0, train=0.3, val=0.06, final=final) <= 12.0
    # An allowance that does not fit is no "over budget": one epoch and its validation fit, the estimate does not.
    squeezed = fit(12.0 / 3600, elapsed_seconds=9.0, epoch_seconds=[], val_seconds=[], epochs_done=0,
                   prior_epoch_seconds=0.3, prior_val_seconds=0.06, final_seconds=10.0)
    assert squeezed.epochs == 1 and not squeezed.over_budget


def test_the_clock_counts_what_the_process_spent_before_it() -> None:
    """A command's --time clock starts at the process's start (imports: 1.5-3 s, by which --time 12s ran over), and a
    resumed run's clock adds the time the run had spent before."""
    assert RunClock().elapsed() < 5.0 <= RunClock(before=5.0).elapsed()
    resumed = RunClock(before=5.0)
    resumed.restore(100.0, [], [])
    assert resumed.elapsed() >= 105.0


def test_a_bare_number_budget_is_shown_in_hours() -> None:
    """Ultralytics' time=0.01 is hours; the plan's line said "time budget 0.01" without a unit."""
    assert TimeBudget.parse("0.01").text == "0.01h" and TimeBudget.parse("8m").text == "8m"
    assert fit("0.01").describe().startswith("time budget 0.01h:")
