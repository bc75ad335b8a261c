"""FigureWorker: a run's matplotlib figures drawn by a forked helper, every file on disk at close, the training
process never importing matplotlib; a helper that dies or a figure that fails never loses the others."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import detector.plots
from detector import forked
from detector.plots import worker as worker_module
from detector.plots.worker import FigureWorker, figures_in_background

pytestmark = pytest.mark.skipif(not forked.fork_available(), reason="this platform cannot fork")
REPO = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"

A_RUN = """
import sys
from pathlib import Path
import torch
from detector.data.build import build_split
from detector.data.dataset import collate
from detector.data.spec import load_dataset_spec
from detector.metrics.loop import run_validation
from detector.plots.reporter import RunReporter
from tests.conftest import write_tiny_dataset

out = Path(sys.argv[1])
split = build_split(load_dataset_spec(write_tiny_dataset(out / "data")), "val", image_size=64, augment=None,
                    cache="false")
batch = collate([split.dataset[i] for i in range(len(split.dataset))])
reporter = RunReporter(out, ["a", "b"], plots=True, tensorboard=False, background=True)
reporter.start()
reporter.on_start(split, batch)
(out / "results.csv").write_text("epoch,train/box,mAP50-95\\n1,2.0,0.1\\n2,1.5,0.2\\n")
reporter.on_epoch_end({"epoch": 2}, 1)
one = {"boxes": torch.tensor([[8.0, 8.0, 40.0, 40.0]]), "scores": torch.ones(1), "labels": torch.zeros(1).long()}
validation = run_validation(lambda images: [one] * len(images), split, [batch], progress=False, keep_predictions=True)
print(reporter.on_final(validation, split).splitlines()[1].split()[0])
reporter.close()
print("matplotlib" in sys.modules, sorted(reporter.figures.seconds))
"""


def test_a_run_with_a_helper_gets_every_figure_and_never_imports_matplotlib(tmp_path: Path, watchdog) -> None:
    done = subprocess.run([sys.executable, "-c", A_RUN, str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                          timeout=180, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    table_first, imported = done.stdout.splitlines()[-2:]
    assert table_first == "all"  # the per-class table, made here
    assert imported == ("False ['plot_confusion_matrix', 'plot_label_arrays', 'plot_pr_curves', 'plot_results']")
    for name in ("labels", "train_batch0", "results", "PR_curve", "confusion_matrix", "val_batch0_pred"):
        assert (tmp_path / f"{name}.png").read_bytes()[:8] == PNG, name


def _csv(folder: Path) -> Path:
    path = folder / "results.csv"
    path.write_text("epoch,train/box,mAP50-95\n1,2.0,0.1\n2,1.5,0.2\n")
    return path


def _dies(handle, jobs, parents_end, parent) -> None:
    jobs.recv()
    os._exit(9)  # as a helper killed for memory ends: no exception, no answer


def test_a_helper_that_dies_costs_one_line_and_no_figure(tmp_path: Path, monkeypatch, capsys, watchdog) -> None:
    monkeypatch.setattr(forked, "_serve", _dies)
    figures = FigureWorker(background=True)
    figures.start()
    helper_pid = figures.helper._process.pid
    figures.draw("plot_results", _csv(tmp_path), tmp_path / "first.png")
    figures.draw("plot_results", _csv(tmp_path), tmp_path / "second.png")  # sent before the death is noticed
    figures.close()
    assert not figures.in_background and helper_pid != os.getpid()
    for name in ("first.png", "second.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG, name
    figures.draw("plot_results", _csv(tmp_path), tmp_path / "third.png")  # the rest: drawn here
    assert (tmp_path / "third.png").read_bytes()[:8] == PNG
    lines = [line for line in capsys.readouterr().err.splitlines() if "helper" in line]
    assert len(lines) == 1 and lines[0].startswith("warning: drawing figures in a helper process failed")


def _broken(csv, png):
    raise ValueError("no font")


def test_a_figure_that_fails_costs_its_line_and_the_others_are_drawn(tmp_path: Path, monkeypatch, capsys,
                                                                      watchdog) -> None:
    monkeypatch.setattr(detector.plots, "plot_results", _broken)  # in the helper too: it is forked after this
    figures = FigureWorker(background=True)
    figures.start()
    figures.draw("plot_results", _csv(tmp_path), tmp_path / "results.png")
    figures.draw("plot_label_arrays", *_labels(), ["a", "b"], tmp_path / "labels.png")
    figures.close()
    assert not (tmp_path / "results.png").exists()
    assert (tmp_path / "labels.png").read_bytes()[:8] == PNG
    err = capsys.readouterr().err
    assert "ValueError: no font" in err and "warning: plot_results: not drawn (ValueError: no font)" in err


def _labels():
    import numpy as np

    return np.array([[0, 0.5, 0.5, 0.2, 0.3], [1, 0.3, 0.6, 0.1, 0.1]]), np.array([1, 1])


def test_only_hosts_with_cores_to_spare_draw_in_a_helper(monkeypatch) -> None:
    assert not figures_in_background(worker_module.FIGURE_MIN_CORES - 1)
    assert figures_in_background(worker_module.FIGURE_MIN_CORES)
    monkeypatch.setattr(worker_module, "fork_available", lambda: False)  # Windows, a daemonic process
    assert not figures_in_background(64)
