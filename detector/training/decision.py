"""What rank 0 decides after an epoch, and every rank applies: the precision for the next epoch, the plan, a stop.

Under torchrun what one rank alone can know (metrics, a Ctrl-C, the clock) becomes an :class:`EpochDecision`
on rank 0 that the others receive (:func:`detector.distributed.decide_on_main`), so all ranks keep stepping
the same way.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from detector.precision import Precision, safer_precision


@dataclass(frozen=True)
class EpochDecision:
    """What rank 0 decided after an epoch; every rank applies it."""

    precision: str  # for the next epoch
    precision_reason: str
    epochs: int  # planned total (a time budget may change it), with the two below
    close_mosaic: int
    warmup_epochs: float
    stop: str = ""  # why the run ends after this epoch; "" = go on
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    final: dict[str, Any] | None = None  # best.pt's final report (metrics, best_epoch), once the run has one


# best.pt's selection score. mAP50-95 alone, as Ultralytics 8.4's ``DetMetrics.fitness`` (and our tune's fitness): the
# epoch best.pt holds is the one with the highest mAP50-95 the run printed. Runs begun before it scored 0.9 x mAP50-95
# + 0.1 x mAP50 (YOLOv5's and Ultralytics' up to 8.3); their checkpoints name no rule, and a resume of one keeps that
# rule, since its saved best fitness is on that scale (a mAP50-95 would rarely beat it, and best.pt stop moving).
FITNESS = "mAP50-95"
LEGACY_FITNESS = "0.9 mAP50-95 + 0.1 mAP50"


def fitness(metrics: dict[str, float], rule: str = FITNESS) -> float:
    """An evaluation's selection score under ``rule`` (:data:`FITNESS` or :data:`LEGACY_FITNESS`)."""
    if rule == FITNESS:
        return metrics.get("mAP50-95", 0.0)
    if rule == LEGACY_FITNESS:
        return 0.9 * metrics.get("mAP50-95", 0.0) + 0.1 * metrics.get("mAP50", 0.0)
    raise ValueError(f"unknown fitness rule {rule!r}; expected {FITNESS!r} or {LEGACY_FITNESS!r}")


def fallback_after_epoch(precision: Precision, stats: dict[str, float], device_type: str, *,
                         ending: bool = False) -> tuple[str, str] | None:
    """``(safer precision, message)`` when half the optimizer steps or more were unstable; None when all is well.
    ``ending``: the run ends with this epoch, so the precision stays and the message says there is nothing to switch.

    Counts ``unstable_steps``, not every skipped step: GradScaler's normal calibration skips are not a
    reason to leave FP16 (see detector/training/engine.py). Raises FloatingPointError when FP32 itself diverged.
    """
    unstable, steps = stats["unstable_steps"], stats["optimizer_steps"]
    if not unstable or 2 * unstable < steps:
        return None
    message = f"{unstable}/{steps} optimizer steps had non-finite gradients"
    safer = safer_precision(precision.name, device_type)
    if safer is None:
        raise FloatingPointError(f"{message} in FP32: training diverged; lower --lr0 or check the data")
    if ending:
        return precision.name, f"{message} in the run's last epoch (no epoch left to train in {safer})"
    return safer, f"{message}; switching {precision.name} -> {safer}"
