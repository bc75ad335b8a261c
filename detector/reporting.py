"""What a run shows people: plots in the run folder, the final per-class table, optional TensorBoard.

Kept out of the trainer so the loop stays about training; every method is a no-op where switched off.
"""

from __future__ import annotations

from pathlib import Path

from detector.data.build import SplitData
from detector.evaluate import EvalResult


class RunReporter:
    def __init__(self, run_dir: Path, names: list[str], *, plots: bool, tensorboard: bool) -> None:
        self.run_dir, self.names, self.plots = run_dir, names, plots
        self.board = None
        if tensorboard:
            from detector.tb import TensorBoardLogger  # optional dependency, imported only when asked for

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
        if self.plots:
            from detector.plots import plot_results

            plot_results(self.run_dir / "results.csv", self.run_dir / "results.png")

    def on_final(self, result: EvalResult, info: dict, val: SplitData) -> str:
        """PR curves, confusion matrix, prediction images; returns the per-class table."""
        from detector.plots import plot_all_validation, validation_stats
        from detector.report import per_class_table

        predictions = info.get("predictions", [])
        if self.plots:
            stats = plot_all_validation(predictions, val, self.names, self.run_dir)
        else:
            stats = validation_stats(predictions, val, len(self.names))
        if self.board is not None:
            for png in sorted(self.run_dir.glob("*.png")):
                self.board.image(png.stem, png, 0)
            self.board.close()
        return per_class_table(self.names, val.records, result, stats.precision, stats.recall)
