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
from detector.plots.worker import FigureWorker, Inherited
from detector.runs import last_results_epoch


def validation_report(validation: Validation, split: SplitData, names: list[str], *, plot_dir: Path | None,
                      draw: Callable[..., None] | None = None) -> str:
    """The per-class table for one validation pass; with ``plot_dir``, also its PR curves, confusion matrix
    and prediction images there (P and R come from the same matching either way). ``draw``: where the matplotlib
    figures are drawn (a run's :class:`~detector.plots.worker.FigureWorker`; default: here)."""
    from detector.metrics.matching import validation_stats
    from detector.metrics.table import per_class_table

    predictions = validation.predictions or []
    if plot_dir is not None:
        from detector.plots import draw as draw_here
        from detector.plots.validation import plot_all_validation

        stats = plot_all_validation(predictions, split, names, plot_dir, draw=draw or draw_here)
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
    redraw waits :data:`RESULTS_PLOT_SECONDS` from the reporter's creation (a short run draws it at the end only).
    ``background``: its matplotlib figures are drawn by a helper process (detector/plots/worker.py), forked at
    :meth:`start`; every figure is on disk once :meth:`close` returns."""

    def __init__(self, run_dir: Path, names: list[str], *, plots: bool, tensorboard: bool,
                 clock: Callable[[], float] = time.monotonic, background: bool = False) -> None:
        self.run_dir, self.names, self.plots = run_dir, names, plots
        self.board = None
        self.clock = clock
        self.figures = FigureWorker(background=plots and background)
        self._final = False  # the final report was made: TensorBoard gets its figures at close
        self._results_plotted_at, self._results_plot_cost = clock(), 0.0
        self._rows_undrawn = False  # results.csv has rows results.png does not show yet
        # TensorBoard's step is the epoch as results.csv and the console count it, from 1 (Ultralytics' too); the
        # final report's figures go at the last epoch logged.
        self._step = 0
        if tensorboard:
            from detector.plots.tensorboard import TensorBoardLogger  # optional dependency: imported when asked for

            # A resumed run's results.csv keeps the rows of the epochs it does not train again (the trainer drops the
            # others before the reporter exists); TensorBoard hides the killed process's events after them too, which
            # this one logs anew. A new run's folder has no results.csv: step 1 on, there is nothing to hide.
            self._step = last_results_epoch(run_dir / "results.csv")
            self.board = TensorBoardLogger(run_dir, purge_step=self._step + 1)

    def start(self, train: SplitData) -> None:
        """Fork the figures' helper, if it draws them: before the run's loaders fork their workers, so that it maps
        none of their shared-memory batch buffers. It inherits ``train``'s label records for labels.png."""
        if self.plots:
            self.figures.inherit("train records", train.records)
            self.figures.start()

    def on_start(self, train: SplitData, first_batch: tuple) -> None:
        """Label statistics, and the first training batch (``collate`` output) as the loader augments it."""
        if not self.plots:
            return
        from detector.plots.batches import plot_batch  # OpenCV: no matplotlib

        self.figures.inherit("train records", train.records)  # where start() was not called (tests)
        self.figures.draw("plot_label_stats", Inherited("train records"), self.names, self.run_dir / "labels.png")
        images, targets, _ = first_batch
        plot_batch(images, targets, self.names, self.run_dir / "train_batch0.png")

    def on_epoch_end(self, row: dict[str, object], epoch: int) -> None:
        if self.board is not None:
            self._step = epoch + 1
            self.board.scalars({k: v for k, v in row.items() if isinstance(v, (int, float))}, self._step)
        if self.figures.in_background:  # the helper's time for the last redraw, once it has answered
            self._results_plot_cost = self.figures.seconds.get("plot_results", self._results_plot_cost)
        # Before the first redraw, labels.png's time says what a figure costs on this host (0.8 s on a 2-core Xeon:
        # a first redraw 30 s in would have taken 3% of the run so far).
        cost = self._results_plot_cost or self.figures.seconds.get("plot_label_stats", 0.0)
        wait = max(RESULTS_PLOT_SECONDS, cost / PLOT_SHARE)
        self._rows_undrawn = self.plots
        if self.plots and self.clock() - self._results_plotted_at >= wait and not self.figures.pending("plot_results"):
            self._plot_results()

    def _plot_results(self) -> None:
        start = self.clock()
        self.figures.draw("plot_results", self.run_dir / "results.csv", self.run_dir / "results.png")
        self._results_plotted_at = self.clock()
        if not self.figures.in_background:
            self._results_plot_cost = self._results_plotted_at - start
        self._rows_undrawn = False

    def figure_seconds(self) -> float | None:
        """The slowest figure drawn so far, in seconds (None: none timed yet, or plots are off): what the final
        report's figures are planned from (detector/training/budget.py, ``report_seconds``)."""
        return max(self.figures.seconds.values(), default=None) if self.plots else None

    def on_final(self, validation: Validation, val: SplitData) -> str:
        """PR curves, confusion matrix, prediction images; returns the per-class table. The figures a helper draws
        are on disk once :meth:`close` returns."""
        table = validation_report(validation, val, self.names, plot_dir=self.run_dir if self.plots else None,
                                  draw=self.figures.draw)
        if self.plots and (self.run_dir / "results.csv").is_file():  # every epoch's row, whenever the last redraw was
            self._plot_results()
        self._final = True
        return table

    def close(self) -> None:
        """Draw results.png if it misses rows (a run stopped by Ctrl-C or an error gets no final report), wait for
        every figure, flush and close TensorBoard's event file; safe to call again. A plot that fails here is one
        warning, so it never hides the error that stopped the run."""
        if self._rows_undrawn and (self.run_dir / "results.csv").is_file():
            try:
                self._plot_results()
            except Exception as error:  # noqa: BLE001 - the run's own outcome matters more than its figure
                warnings.warn(f"{self.run_dir / 'results.png'}: not drawn ({error})", stacklevel=2)
            self._rows_undrawn = False
        try:
            self.figures.close()
        finally:
            if self.board is not None:
                board, self.board = self.board, None
                try:
                    if self._final:
                        for png in sorted(self.run_dir.glob("*.png")):
                            board.image(png.stem, png, self._step)
                finally:
                    board.close()
