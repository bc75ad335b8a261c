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
