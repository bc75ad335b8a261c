"""An epoch's row of ``results.csv``: training and validation losses, learning rate, COCO metrics, the val table's P and
R, precision, validation time, evaluator."""

from __future__ import annotations

from detector.metrics.coco import METRIC_NAMES
from detector.metrics.loop import PR_COLUMNS, Validation
from detector.metrics.val_loss import LOSS_COLUMNS


def results_row(epoch: int, stats: dict[str, float], validation: Validation | None, precision: str) -> dict[str, object]:
    """The row for ``epoch`` (0-based; the row says ``epoch + 1``). ``stats`` is what the epoch's training loop
    returned; its keys beyond the fixed columns follow them. The validation losses (``val/box``...) follow the
    training ones, as Ultralytics' do; P and R follow the mAP columns. Metrics, P and R and validation losses are empty
    and ``val_seconds`` NaN where the epoch was not evaluated; ``evaluator`` names the library that produced the row's
    mAP (empty there)."""
    metrics = validation.metrics if validation else {}
    losses = validation.losses if validation else {}
    row: dict[str, object] = {"epoch": epoch + 1, **{k: stats[k] for k in ("train/box", "train/cls", "train/dfl")}}
    row.update({k: losses.get(k, "") for k in LOSS_COLUMNS})
    row["lr"] = stats["lr"]
    row.update({k: metrics.get(k, "") for k in (*METRIC_NAMES, *PR_COLUMNS)})  # P and R where the pass scored them
    row.update({"precision": precision, "val_seconds": validation.seconds if validation else float("nan"),
                "evaluator": validation.result.evaluator if validation else ""})
    row.update({k: v for k, v in stats.items() if k not in row})
    return row
