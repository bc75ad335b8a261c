"""What a run shows people: plots in the run folder, the per-class table, optional TensorBoard.

Kept out of the trainer so the loop stays about training; every method is a no-op where switched off.
:func:`validation_report` is the one table-and-figures step after a validation pass, for training's
final evaluation and the ``val`` command alike.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from pathlib import Path

from detector.data.build import SplitData
from detector.metrics.loop import Validation


def validation_report(validation: Validation, split: SplitData, names: list[str], *, plot_dir: Path | None) -> str:
    """The per-class table for one validation pass; with ``plot_dir``, also its PR curves, confusion matrix
    and prediction images there (P and R come from the same matching either way)."""
    from detector.metrics.matching import validation_stats
    from detector.metrics.table import per_class_table

    predictions = validation.predictions or []
    if plot_dir is not None:
        from detector.plots.metrics import plot_all_validation  # matplotlib: only where figures are drawn

        stats = plot_all_validation(predictions, split, names, plot_dir)
    else:
        stats = validation_stats(predictions, split, len(names))
    return per_class_table(names, split.records, validation.result, stats.precision, stats.recall)


# results.png is redrawn after an epoch at most this often, and always at the end: matplotlib takes 0.6-0.9 s per
# redraw on a 2-core CPU, which every epoch of a short run paid (30 epochs of ~1 s each on a GPU: 15 s of plots).
RESULTS_PLOT_SECONDS = 30.0
# ...and at most this share of the run: each redraw is timed, and the next waits for 1/PLOT_SHARE times as long.
PLOT_SHARE = 0.01


class RunReporter:
    """Plots and TensorBoard for one run. ``clock``: monotonic seconds (tests pass a fake one); the first results.png
    redraw waits :data:`RESULTS_PLOT_SECONDS` from the reporter's creation (a short run draws it at the end only)."""

    def __init__(self, run_dir: Path, names: list[str], *, plots: bool, tensorboard: bool,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.run_dir, self.names, self.plots = run_dir, names, plots
        self.board = None
        self.clock = clock
        self._results_plotted_at, self._results_plot_cost = clock(), 0.0
        self._rows_undrawn = False  # results.csv has rows results.png does not show yet
        if tensorboard:
            from detector.plots.tensorboard import TensorBoardLogger  # optional dependency: imported when asked for

            self.board = TensorBoardLogger(run_dir)

    def on_start(self, train: SplitData, first_batch: tuple) -> None:
        """Label statistics, and the first training batch (``collate`` output) as the loader augments it."""
        if not self.plots:
            return
        from detector.plots import plot_batch, plot_label_stats

        plot_label_stats(train.records, self.names, self.run_dir / "labels.png")
        images, targets, _ = first_batch
        plot_batch(images, targets, self.names, self.run_dir / "train_batch0.png")

    def on_epoch_end(self, row: dict[str, object], epoch: int) -> None:
        if self.board is not None:
            self.board.scalars({k: v for k, v in row.items() if isinstance(v, (int, float))}, epoch)
        wait = max(RESULTS_PLOT_SECONDS, self._results_plot_cost / PLOT_SHARE)
        self._rows_undrawn = self.plots
        if self.plots and self.clock() - self._results_plotted_at >= wait:
            self._plot_results()

    def _plot_results(self) -> None:
        from detector.plots import plot_results

        start = self.clock()
        plot_results(self.run_dir / "results.csv", self.run_dir / "results.png")
        self._results_plotted_at = self.clock()
        self._results_plot_cost = self._results_plotted_at - start
        self._rows_undrawn = False

    def on_final(self, validation: Validation, val: SplitData) -> str:
        """PR curves, confusion matrix, prediction images; returns the per-class table."""
        table = validation_report(validation, val, self.names, plot_dir=self.run_dir if self.plots else None)
        if self.plots and (self.run_dir / "results.csv").is_file():  # every epoch's row, whenever the last redraw was
            self._plot_results()
        if self.board is not None:
            for png in sorted(self.run_dir.glob("*.png")):
                self.board.image(png.stem, png, 0)
        self.close()
        return table

    def close(self) -> None:
        """Draw results.png if it misses rows (a run stopped by Ctrl-C or an error gets no final report), flush and
        close TensorBoard's event file; safe to call again. A plot that fails here is one warning, so it never
        hides the error that stopped the run."""
        if self._rows_undrawn and (self.run_dir / "results.csv").is_file():
            try:
                self._plot_results()
            except Exception as error:  # noqa: BLE001 - the run's own outcome matters more than its figure
                warnings.warn(f"{self.run_dir / 'results.png'}: not drawn ({error})", stacklevel=2)
            self._rows_undrawn = False
        if self.board is not None:
            self.board.close()
            self.board = None
