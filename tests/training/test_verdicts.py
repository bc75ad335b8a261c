"""The run's verdicts on its epochs (detector/training/verdicts.py): the best fitness, best.pt's epoch, --patience."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from detector.checkpoint import RunState, save_checkpoint
from detector.training.verdicts import Verdicts, patience_note

STATS = {"images_per_s": 100.0, "data_wait": 0.0}


def scored(map50_95: float, map50: float | None = None, precision_recall: tuple[float, float] | None = None,
           ) -> SimpleNamespace:
    """What ``judge`` reads of a validation: its metrics (mAP50 and mAP75 as mAP50-95 unless given), its mean P and R
    (none unless given) and seconds."""
    map50 = map50_95 if map50 is None else map50
    precision, recall = precision_recall or (None, None)
    return SimpleNamespace(metrics={"mAP50-95": map50_95, "mAP50": map50, "mAP75": map50_95}, seconds=0.1,
                           result=SimpleNamespace(mean_precision=precision, mean_recall=recall))


def verdicts(patience: int) -> Verdicts:
    return Verdicts(patience, log=lambda line: None, record=lambda *row: None)


def test_patience_waits_while_every_score_is_zero_as_ultralytics_does():
    """--epochs 30 --patience 3 at 64 px stopped after epoch 4, mAP 0 throughout, its warm-up still under way. As
    Ultralytics' EarlyStopping does, the epochs patience counts from move on while the best fitness is 0."""
    judge = verdicts(3)
    for epoch in range(8):
        judge.judge(epoch, STATS, scored(0.0), "fp32")
        assert not judge.patience_ran_out(epoch)
        assert judge.improved(epoch)  # best.pt: the latest of equal fitnesses (test_ties_below)
    judge.judge(8, STATS, scored(0.01), "fp32")  # the first box found: counted from here
    assert judge.improved(8)
    for epoch in (9, 10):
        judge.judge(epoch, STATS, scored(0.005), "fp32")
        assert not judge.patience_ran_out(epoch)
    judge.judge(11, STATS, scored(0.005), "fp32")
    assert judge.patience_ran_out(11) and judge.best_epoch == 8


def test_a_resumed_run_counts_patience_from_where_it_was():
    judge = verdicts(3)
    for epoch in range(5):
        judge.judge(epoch, STATS, scored(0.0), "fp32")
    resumed = verdicts(3)
    resumed.restore(RunState(epoch=4, config={}, names=[], precision="fp32", **judge.state()))
    assert resumed.state() == judge.state() == {"best_fitness": 0.0, "best_epoch": 4, "patience_epoch": 4,
                                                "fitness_rule": "mAP50-95"}
    assert not resumed.patience_ran_out(6) and resumed.patience_ran_out(7)
    older = verdicts(3)  # a checkpoint from before patience_epoch: counted from its best epoch, as it was
    older.restore(RunState(epoch=4, config={}, names=[], precision="fp32", best_fitness=0.0, best_epoch=0))
    assert older.patience_ran_out(3)


def test_the_early_stop_says_the_epochs_that_passed_and_a_patience_under_the_val_interval_is_noted():
    """--val-interval 3 --patience 2: validated at epochs 3 and 6 (0-based 2, 5), the first that does not improve
    stops the run, and the line says the 3 epochs since the best, not --patience's 2. Such a run says at its start
    that patience counts epochs (as Ultralytics' does), so it stops at the first validation without a better one."""
    judge = verdicts(2)
    judge.judge(2, STATS, scored(0.5), "fp32")
    judge.judge(5, STATS, scored(0.4), "fp32")
    assert judge.patience_ran_out(5)
    assert judge.early_stop_text(5).startswith("early stop: no better fitness for 3 epochs (best at epoch 3, "
                                               "--patience 2)")
    one = verdicts(1)
    one.judge(0, STATS, scored(0.5), "fp32")
    one.judge(1, STATS, scored(0.4), "fp32")
    assert "no better fitness for 1 epoch (best at epoch 1, --patience 1)" in one.early_stop_text(1)
    assert patience_note(2, 3) == ("note: --patience 2 counts epochs (as Ultralytics' patience does) and "
                                   "--val-interval 3 validates every 3: the first validation that does not improve "
                                   "stops the run")
    assert patience_note(3, 3) == patience_note(0, 3) == patience_note(2, 0) == patience_note(100, 1) == ""


def test_ties_keep_the_latest_for_best_pt_and_do_not_restart_patience_as_in_ultralytics():
    """Of equal fitnesses best.pt is the latest, as Ultralytics rewrites best.pt when ``best_fitness == fitness``: it
    was the first, so a run that scored 0 throughout took away its first validated, nearly untrained, epoch. Patience
    counts from the last epoch that raised the best, as Ultralytics' EarlyStopping (``fitness > self.best_fitness``):
    a tie is no improvement there."""
    zeros = verdicts(0)
    for epoch in range(4):
        zeros.judge(epoch, STATS, scored(0.0), "fp32")
    assert zeros.best_epoch == 3
    judge = verdicts(2)
    for epoch, score in enumerate([0.5, 0.5, 0.5]):
        judge.judge(epoch, STATS, scored(score), "fp32")
        assert judge.improved(epoch) and judge.patience_ran_out(epoch) == (epoch == 2)
    assert judge.early_stop_text(2).startswith("early stop: no better fitness for 2 epochs (best at epoch 3, equal "
                                               "to epoch 1's, --patience 2)")
    judge.judge(3, STATS, scored(0.4), "fp32")
    assert not judge.improved(3) and judge.best_epoch == 2


# Two epochs the rules rank differently: 0.9 x 0.50 + 0.1 x 0.90 = 0.540 against 0.9 x 0.51 + 0.1 x 0.60 = 0.519.
HIGH_MAP50, HIGH_MAP50_95 = scored(0.50, 0.90), scored(0.51, 0.60)


def test_best_pt_is_the_epoch_with_the_highest_map50_95_as_in_ultralytics_8_4():
    """best.pt is chosen by mAP50-95 alone (Ultralytics 8.4's ``DetMetrics.fitness``, our tune's fitness): the epoch
    with the higher mAP50-95 wins though its mAP50 is lower, and the checkpoint names the rule."""
    judge = verdicts(0)
    judge.judge(0, STATS, HIGH_MAP50, "fp32")
    judge.judge(1, STATS, HIGH_MAP50_95, "fp32")
    assert judge.best_epoch == 1 and judge.best_fitness == 0.51
    assert judge.state()["fitness_rule"] == "mAP50-95"


def test_a_run_resumed_from_a_checkpoint_without_a_rule_keeps_the_older_one():
    """A checkpoint written before the rule was named holds a best fitness of 0.9 x mAP50-95 + 0.1 x mAP50: its resume
    goes on scoring that way, so a later epoch is compared on the same scale (mAP50-95 alone would rarely beat it)."""
    judge = verdicts(0)
    judge.restore(RunState(epoch=0, config={}, names=[], precision="fp32", best_fitness=0.54, best_epoch=0))
    judge.judge(1, STATS, HIGH_MAP50_95, "fp32")
    assert judge.best_epoch == 0 and judge.state()["fitness_rule"] == "0.9 mAP50-95 + 0.1 mAP50"
    judge.judge(2, STATS, scored(0.6), "fp32")
    assert judge.best_epoch == 2 and abs(judge.best_fitness - 0.6) < 1e-12


def test_a_best_pt_scored_by_another_rule_is_rescored_from_its_metrics(tmp_path: Path):
    """A resumed run's best.pt newer than its last.pt is the best to beat (``keep_best_on_disk``); one whose fitness was
    scored by another rule is compared by its metrics on the run's scale, not by its number."""
    best = tmp_path / "best.pt"
    save_checkpoint({"model": {}, "best_fitness": 0.54, "best_epoch": 3, "metrics": HIGH_MAP50.metrics}, best)
    judge = verdicts(0)
    judge.restore(RunState(epoch=3, config={}, names=[], precision="fp32", best_fitness=0.4, best_epoch=1,
                           fitness_rule="mAP50-95"))
    judge.keep_best_on_disk(best)
    assert (judge.best_fitness, judge.best_epoch) == (0.5, 3)
    judge.judge(4, STATS, HIGH_MAP50_95, "fp32")  # 0.51 beats best.pt's 0.50 here, not its stored 0.54
    assert judge.best_epoch == 4


def test_the_epochs_line_says_p_and_r_after_the_maps_as_the_val_table_rounds_them():
    """Ultralytics prints P and R every epoch: ours follow mAP75, to the val table's 3 decimals; a pass scored without
    them (none in training) prints the mAPs alone."""
    lines = []
    judge = Verdicts(0, log=lines.append, record=lambda *row: None)
    judge.judge(0, STATS, scored(0.25, precision_recall=(0.81234, 0.5)), "fp32")
    judge.judge(1, STATS, scored(0.25), "fp32")
    assert lines[0].startswith("epoch 1: mAP50-95 0.2500  mAP50 0.2500  mAP75 0.2500  P 0.812  R 0.500 | ")
    assert lines[1].startswith("epoch 2: mAP50-95 0.2500  mAP50 0.2500  mAP75 0.2500 | ")
