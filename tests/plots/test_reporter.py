import time
from pathlib import Path
from types import SimpleNamespace

import detector.plots
import detector.plots.batches as plot_batches
import detector.plots.reporter as reporter_module
from detector.plots.reporter import RunReporter
from tests.conftest import FakeClock


def test_results_png_waits_its_interval_from_the_start_and_then_its_cost_share(tmp_path: Path, monkeypatch):
    clock = FakeClock(now=1000.0)
    drawn = []

    def plot(csv, png):  # a redraw that takes 2 s on the fake clock
        clock.now += 2.0
        drawn.append(png)

    monkeypatch.setattr(detector.plots, "plot_results", plot)
    reporter = RunReporter(tmp_path, ["a"], plots=True, tensorboard=False, clock=clock)
    epoch_end = lambda epoch: reporter.on_epoch_end({"epoch": epoch + 1}, epoch)  # noqa: E731
    for epoch in range(29):  # epochs of 1 s: none within the first RESULTS_PLOT_SECONDS of the run is drawn
        clock.now += 1.0
        epoch_end(epoch)
    assert drawn == []
    clock.now += 1.0
    epoch_end(29)
    assert drawn == [tmp_path / "results.png"]
    # A 2 s redraw at a 1% share waits 200 s, longer than the interval: 199 s later it is not due, 200 s it is.
    assert 2.0 / reporter_module.PLOT_SHARE > reporter_module.RESULTS_PLOT_SECONDS
    clock.now += 199.0
    epoch_end(30)
    assert len(drawn) == 1
    clock.now += 1.0
    epoch_end(31)
    assert len(drawn) == 2


def test_a_run_that_stops_early_still_has_its_tensorboard_events_on_disk(tmp_path: Path):
    """A Ctrl-C or an error skips the final report, which closed TensorBoard's file; the trainer closes it then
    (commands end without the exit-time garbage collection that would otherwise have flushed it)."""
    import pytest

    pytest.importorskip("tensorboard")
    reporter = RunReporter(tmp_path, ["a"], plots=False, tensorboard=True)
    events = list(tmp_path.rglob("events.out.tfevents.*"))
    size_before = sum(path.stat().st_size for path in events)
    for epoch in range(3):
        reporter.on_epoch_end({"epoch": epoch + 1, "train/box": 1.0 / (epoch + 1)}, epoch)
    reporter.close()
    reporter.close()  # again, as the trainer's clean-up may after the final report: nothing happens
    events = list(tmp_path.rglob("events.out.tfevents.*"))
    assert events and sum(path.stat().st_size for path in events) > size_before


def test_tensorboard_shows_the_validation_losses_beside_the_training_ones(tmp_path: Path):
    """Each numeric results.csv column is a scalar: val/box, val/cls, val/dfl beside train/box...; an epoch not
    evaluated (its cells empty) has no point there rather than a zero."""
    import pytest

    pytest.importorskip("tensorboard")
    reporter = RunReporter(tmp_path, ["a"], plots=False, tensorboard=True)
    reporter.on_epoch_end({"epoch": 1, "train/box": 2.0, "val/box": "", "val/cls": "", "val/dfl": ""}, 0)
    reporter.on_epoch_end({"epoch": 2, "train/box": 1.5, "val/box": 1.75, "val/cls": 2.5, "val/dfl": 1.25}, 1)
    reporter.close()
    shown = _board(tmp_path)
    assert [value for _, value in shown["train/box"]] == [2.0, 1.5]
    assert {tag: [value for _, value in shown[tag]] for tag in ("val/box", "val/cls", "val/dfl")} == {
        "val/box": [1.75], "val/cls": [2.5], "val/dfl": [1.25]}


def test_a_run_stopped_before_its_first_redraw_still_gets_results_png_when_closed(tmp_path: Path, monkeypatch):
    drawn = []
    monkeypatch.setattr(detector.plots, "plot_results", lambda csv, png: drawn.append(png))
    (tmp_path / "results.csv").write_text("epoch\n1\n")
    reporter = RunReporter(tmp_path, ["a"], plots=True, tensorboard=False, clock=FakeClock(now=0.0))
    reporter.on_epoch_end({"epoch": 1}, 0)  # within the first 30 s: not drawn
    assert drawn == []
    reporter.close()  # a Ctrl-C: no final report, but the figure shows the epochs done
    reporter.close()
    assert drawn == [tmp_path / "results.png"]


def test_the_first_results_png_waits_for_labels_png_cost_share(tmp_path: Path, monkeypatch):
    """Before results.png was ever drawn, labels.png's time is what a figure costs on this host."""
    clock = FakeClock(now=0.0)
    drawn = []
    monkeypatch.setattr(detector.plots, "plot_results", lambda csv, png: drawn.append(png))
    reporter = RunReporter(tmp_path, ["a"], plots=True, tensorboard=False, clock=clock)
    monkeypatch.setattr(detector.plots, "plot_label_stats", lambda records, names, png: time.sleep(0.01))
    monkeypatch.setattr(plot_batches, "plot_batch", lambda *args: None)
    reporter.on_start(SimpleNamespace(records=[]), (None, None, None))
    assert reporter.figures.seconds["plot_label_stats"] >= 0.01  # on_start measured labels.png
    reporter.figures.seconds["plot_label_stats"] = 0.5  # as if it took 0.5 s: a 0.5 s figure waits 50 s
    assert 0.5 / reporter_module.PLOT_SHARE > reporter_module.RESULTS_PLOT_SECONDS
    clock.now = 49.0
    reporter.on_epoch_end({"epoch": 1}, 0)
    assert drawn == []
    clock.now = 50.0
    reporter.on_epoch_end({"epoch": 2}, 1)
    assert drawn == [tmp_path / "results.png"]


def test_a_figure_that_fails_while_closing_is_one_warning(tmp_path: Path, monkeypatch):
    import pytest

    def broken(csv, png):
        raise ValueError("no font")

    monkeypatch.setattr(detector.plots, "plot_results", broken)
    (tmp_path / "results.csv").write_text("epoch\n1\n")
    reporter = RunReporter(tmp_path, ["a"], plots=True, tensorboard=False, clock=FakeClock(now=0.0))
    reporter.on_epoch_end({"epoch": 1}, 0)
    with pytest.warns(UserWarning, match=r"results\.png: not drawn \(no font\)"):
        reporter.close()


def test_the_per_class_table_without_figures_never_imports_the_figure_code(tiny_split, monkeypatch):
    """``--no-plots`` and ``val --no-plots`` print the table only: matplotlib's import (0.5-0.8 s on a 2-core CPU)
    would be a fixed cost of every such run. ``None`` in ``sys.modules`` makes importing that module fail."""
    import sys

    import torch

    from detector.data.dataset import collate
    from detector.metrics.loop import run_validation
    from detector.plots.reporter import validation_report

    monkeypatch.setitem(sys.modules, "detector.plots.metrics", None)
    batch = collate([tiny_split.dataset[i] for i in range(len(tiny_split.dataset))])
    ones = {"boxes": torch.tensor([[8.0, 8.0, 40.0, 40.0]]), "scores": torch.ones(1), "labels": torch.zeros(1).long()}
    validation = run_validation(lambda images: [ones] * len(images), tiny_split, [batch], progress=False,
                                keep_predictions=True)
    table = validation_report(validation, tiny_split, ["a", "b"], plot_dir=None)
    assert table.splitlines()[1].split()[0] == "all"


def _board(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """What TensorBoard shows of a run folder: each tag's (step, value) points, images as (step, 0.0)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    shown = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    shown.update({tag: [(e.step, 0.0) for e in events.Images(tag)] for tag in events.Tags()["images"]})
    return shown


def _tiny_validation(split):
    import torch

    from detector.data.dataset import collate
    from detector.metrics.loop import run_validation

    batch = collate([split.dataset[i] for i in range(len(split.dataset))])
    ones = {"boxes": torch.tensor([[8.0, 8.0, 40.0, 40.0]]), "scores": torch.ones(1), "labels": torch.zeros(1).long()}
    return run_validation(lambda images: [ones] * len(images), split, [batch], progress=False, keep_predictions=True)


def test_tensorboard_counts_epochs_from_1_and_puts_the_final_figures_at_the_last(tmp_path: Path, tiny_split):
    """Epoch 1 was logged at step 0 while the console and results.csv call it 1 (Ultralytics logs at epoch + 1),
    and the final report's figures went to step 0, before the first epoch."""
    import cv2
    import numpy as np
    import pytest

    pytest.importorskip("tensorboard")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    reporter = RunReporter(run_dir, ["a", "b"], plots=False, tensorboard=True)
    for epoch in range(3):
        reporter.on_epoch_end({"epoch": epoch + 1, "train/box": 1.0 / (epoch + 1)}, epoch)
    cv2.imwrite(str(run_dir / "PR_curve.png"), np.zeros((8, 8, 3), np.uint8))  # as the final report's figures are
    reporter.on_final(_tiny_validation(tiny_split), tiny_split)
    reporter.close()
    shown = _board(run_dir)
    assert [step for step, _ in shown["train/box"]] == [1, 2, 3]
    assert [value for _, value in shown["epoch"]] == [1.0, 2.0, 3.0]  # the step is the row's epoch
    assert shown["PR_curve"] == [(3, 0.0)]


def test_a_resumed_run_replaces_the_tensorboard_epochs_it_trains_again(tmp_path: Path):
    """The killed process had logged epochs 4 and 5 after its last.pt (epoch 3); the resumed one trains them again.
    Its event file repeated those steps and the curves doubled back: TensorBoard now shows each epoch once, the
    resumed process's value where both logged it, as results.csv keeps one row per epoch."""
    import pytest

    from detector.runs import append_results, keep_results_through

    pytest.importorskip("tensorboard")
    killed = RunReporter(tmp_path, ["a"], plots=False, tensorboard=True)
    for epoch in range(5):
        row = {"epoch": epoch + 1, "train/box": float(epoch + 1)}
        append_results(tmp_path / "results.csv", row)
        killed.on_epoch_end(row, epoch)
    killed.close()  # the kill's lost tail aside, what a killed process leaves on disk
    time.sleep(1.1)  # the event file's name holds its second: the resumed file sorts after the killed one
    assert keep_results_through(tmp_path / "results.csv", 3) == 3  # as the trainer does before the reporter exists
    resumed = RunReporter(tmp_path, ["a"], plots=False, tensorboard=True)
    for epoch in range(3, 6):
        resumed.on_epoch_end({"epoch": epoch + 1, "train/box": 10.0 * (epoch + 1)}, epoch)
    resumed.close()
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 2
    assert _board(tmp_path)["train/box"] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0), (5, 50.0), (6, 60.0)]
