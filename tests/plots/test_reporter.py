from pathlib import Path

import detector.plots
import detector.plots.reporter as reporter_module
from detector.plots.reporter import RunReporter


def test_results_png_is_redrawn_at_most_every_so_often_during_a_run(tmp_path: Path, monkeypatch):
    drawn = []
    monkeypatch.setattr(detector.plots, "plot_results", lambda csv, png: drawn.append(png))
    clock = [1000.0]
    monkeypatch.setattr(reporter_module.time, "monotonic", lambda: clock[0])
    reporter = RunReporter(tmp_path, ["a"], plots=True, tensorboard=False)
    for epoch in range(5):  # five epochs of 1 s: the first is drawn, the next four are within the interval
        reporter.on_epoch_end({"epoch": epoch + 1}, epoch)
        clock[0] += 1.0
    assert len(drawn) == 1
    clock[0] += reporter_module.RESULTS_PLOT_SECONDS
    reporter.on_epoch_end({"epoch": 6}, 5)
    assert drawn == [tmp_path / "results.png"] * 2


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
