"""The run's verdicts on its epochs: the best fitness so far and its epoch, ``--patience``, and the one epoch whose
validation is still being scored in the background (``--val-background``, detector/metrics/background.py).

An epoch is judged once its scores are in: its line is printed, the best fitness updated, its results.csv row
written. A pass scored in the background is judged at the next epoch's end, before that epoch's own pass, so rows
stay in epoch order and the scores have had a whole epoch to arrive; the trainer judges at once where the run ends
or may stop (detector/training/trainer.py, ``after_epoch``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from detector.checkpoint import CheckpointError, RunState, load_checkpoint
from detector.metrics.loop import Validation
from detector.training.decision import FITNESS, LEGACY_FITNESS, fitness


def graph_costs_text(stats: dict[str, float]) -> str:
    """``, 3 graphs captured in 1.2 s, 5 eager steps`` for an epoch whose CUDA graphs met new keys (detector/training/
    cuda_graph.py, ``GraphCosts``); empty for any other epoch."""
    captures, eager = int(stats.get("graph_captures", 0)), int(stats.get("graph_eager_steps", 0))
    if not captures and not eager:
        return ""
    return (f", {captures} graph{'s' * (captures != 1)} captured in {stats.get('graph_capture_seconds', 0.0):.1f} s, "
            f"{eager} eager step{'s' * (eager != 1)}")


def patience_note(patience: int, val_interval: int) -> str:
    """The run's note at its start where ``--patience`` is shorter than ``--val-interval`` (empty otherwise): patience
    counts epochs, as Ultralytics' does, so the first validation that does not improve stops the run."""
    if not 0 < patience < val_interval:
        return ""
    return (f"note: --patience {patience} counts epochs (as Ultralytics' patience does) and --val-interval "
            f"{val_interval} validates every {val_interval}: the first validation that does not improve stops the run")


@dataclass
class Pending:
    """An epoch whose validation is being scored in the background, with what its verdict will need."""

    epoch: int
    stats: dict[str, float]  # what the epoch's training loop returned
    validation: Validation
    precision: str  # the precision the epoch trained in (a fallback after it changes the step's)


class Verdicts:
    """Judges epochs (see the module docstring).

    Args:
        patience: ``--patience`` (0: never stop early).
        log: prints a line (rank 0's).
        record: writes an epoch's results.csv row: ``(epoch, stats, validation or None, precision)``.
    """

    def __init__(self, patience: int, *, log: Callable[[str], None],
                 record: Callable[[int, dict[str, float], Validation | None, str], None]) -> None:
        self.patience, self.log, self.record = patience, log, record
        # best.pt's: of equal fitnesses the latest, as Ultralytics rewrites best.pt on a tie (kept the first, a run
        # that scored 0 throughout took away its first validated, nearly untrained, epoch).
        self.best_fitness, self.best_epoch = -1.0, -1
        self.rule = FITNESS  # how epochs are scored (detector/training/decision.py); a resume keeps its run's
        # --patience counts from this epoch: the last that raised the best fitness (a tie does not, as in Ultralytics'
        # EarlyStopping: "fitness > self.best_fitness"), or while every score has been 0 (no box found yet, as in the
        # first epochs of a short run's warm-up) the latest scored, as that EarlyStopping allows for "an early
        # zero-fitness stage of training". Counted from the first 0, --patience 3 stopped a 30-epoch run at 64 px
        # after epoch 4, its learning rate still rising.
        self.patience_epoch = -1
        self.pending: Pending | None = None
        self.saved: tuple[int, dict[str, Any]] | None = None  # a resumed run's epoch that last.pt left unjudged

    def restore(self, state: RunState) -> None:
        """A resumed run's verdicts so far, from its last.pt; an epoch still being scored when that was written is
        :attr:`saved` for the trainer to score and judge first."""
        self.best_fitness, self.best_epoch = state.best_fitness, state.best_epoch
        self.rule = state.fitness_rule or LEGACY_FITNESS  # None: a checkpoint from before the rule was named
        self.patience_epoch = state.best_epoch if state.patience_epoch is None else state.patience_epoch
        self.saved = (state.epoch, state.unjudged) if state.unjudged else None

    def keep_best_on_disk(self, best: Path) -> None:
        """A resumed run's ``best`` (best.pt) newer than its last.pt (an improvement held while last.pt was not due,
        written when the run failed) stays the best to beat: the resumed run would otherwise judge against last.pt's
        older best, and a weaker epoch replace the file. A best.pt that is missing or does not load (last.pt copied
        alone to another machine) is said now, and the next epoch evaluated writes one anew: judged against nothing,
        it improves (else no epoch might beat the lost best, and the run would end naming a file it never wrote)."""
        try:
            saved = load_checkpoint(best) if best.is_file() else None
            problem = f"{best}: missing"
        except CheckpointError as error:
            saved, problem = None, str(error)
        if saved is None:
            if self.best_epoch >= 0:
                self.log(f"warning: {problem}, so the best so far (epoch {self.best_epoch + 1}) is lost; the next "
                         "epoch evaluated writes best.pt anew")
            self.best_fitness, self.best_epoch = -1.0, -1
            return
        score, epoch = saved.get("best_fitness"), int(saved.get("best_epoch", -1))
        if (saved.get("fitness_rule") or LEGACY_FITNESS) != self.rule and isinstance(saved.get("metrics"), dict):
            score = fitness(saved["metrics"], self.rule)  # a best.pt scored by another rule: on the run's scale
        if isinstance(score, (int, float)) and (score, epoch) > (self.best_fitness, self.best_epoch):
            if score > self.best_fitness:  # a tie does not restart patience (see __init__)
                self.patience_epoch = max(self.patience_epoch, epoch)
            self.best_fitness, self.best_epoch = float(score), epoch

    def state(self) -> dict[str, float | int | str]:
        """What a checkpoint keeps of the verdicts (detector/checkpoint.py, ``RunState``)."""
        return {"best_fitness": self.best_fitness, "best_epoch": self.best_epoch,
                "patience_epoch": self.patience_epoch, "fitness_rule": self.rule}

    def unjudged(self, epoch: int) -> dict[str, Any] | None:
        """What a checkpoint of ``epoch`` keeps of it when its verdict is still pending (None: it was judged)."""
        pending = self.pending
        if pending is None or pending.epoch != epoch:
            return None
        stats = {key: value if isinstance(value, int) else float(value) for key, value in pending.stats.items()}
        return {"stats": stats, "precision": pending.precision}  # plain numbers: torch.load's weights_only reads them

    def judge(self, epoch: int, stats: dict[str, float], validation: Validation | None, precision: str) -> None:
        """Epoch ``epoch``'s verdict (waits for a pass scored in the background): its line, the best fitness,
        its row."""
        if validation is not None:
            shown = "  ".join(f"{key} {validation.metrics[key]:.4f}" for key in ("mAP50-95", "mAP50", "mAP75"))
            result = validation.result
            if result.mean_precision is not None and result.mean_recall is not None:  # as the val table prints them
                shown += f"  P {result.mean_precision:.3f}  R {result.mean_recall:.3f}"
            self.log(f"epoch {epoch + 1}: {shown} | {stats['images_per_s']:.1f} img/s, {stats['data_wait']:.0%} "
                     f"waiting for data{graph_costs_text(stats)} | val {validation.seconds:.1f}s")
            score, before = fitness(validation.metrics, self.rule), self.best_fitness
            if score >= before:  # a tie too: best.pt is the latest of equal epochs (see __init__)
                self.best_fitness, self.best_epoch = score, epoch
            if score > before or self.best_fitness <= 0:  # patience: only a better one (see __init__)
                self.patience_epoch = epoch
        self.record(epoch, stats, validation, precision)

    def defer(self, pending: Pending) -> None:
        assert self.pending is None, "an epoch is already waiting for its verdict"
        self.pending = pending

    def judge_pending(self) -> tuple[bool, dict[str, Any]] | None:
        """Judge the deferred epoch, if any (None: nothing was waiting): whether it improved on the best, and what
        its best.pt candidate, taken before its scores were in, lacks (metrics, best fitness and epoch: see
        :meth:`detector.training.checkpoint_writer.RunCheckpoints.judged`)."""
        pending, self.pending = self.pending, None
        if pending is None:
            return None
        self.judge(pending.epoch, pending.stats, pending.validation, pending.precision)
        return self.improved(pending.epoch), {"metrics": pending.validation.metrics, "best_fitness": self.best_fitness,
                                              "best_epoch": self.best_epoch}

    def patience_ran_out(self, judged: int) -> bool:
        """Whether ``--patience`` epochs have passed since the best one (or the latest scored while all scored 0), as of
        epoch ``judged``."""
        return bool(self.patience) and judged - self.patience_epoch >= self.patience

    def early_stop_text(self, judged: int) -> str:
        """The run's last line where patience ran out at epoch ``judged``: the epochs since the fitness last rose, as
        they were (with --val-interval above --patience, more than --patience: it said "for 2 epochs" when 3 had
        passed), and best.pt's epoch (a later one of equal fitness: said so)."""
        gap, best = judged - self.patience_epoch, self.best_epoch
        tie = f", equal to epoch {self.patience_epoch + 1}'s" if best != self.patience_epoch else ""
        return (f"early stop: no better fitness for {gap} epoch{'s' * (gap != 1)} (best at epoch {best + 1}{tie}, "
                f"--patience {self.patience}); --patience 0 turns this off")

    def improved(self, epoch: int) -> bool:
        """Whether ``epoch`` (judged) is the best so far."""
        return self.best_epoch == epoch
