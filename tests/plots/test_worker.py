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
reporter.start(split)
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
    assert imported == ("False ['plot_confusion_matrix', 'plot_label_stats', 'plot_pr_curves', 'plot_results']")
    for name in ("labels", "train_batch0", "results", "PR_curve", "confusion_matrix", "confusion_matrix_normalized",
                 "val_batch0_pred"):
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
    figures.draw("plot_results", _csv(tmp_path), tmp_path / "first.png")
    figures.draw("plot_results", _csv(tmp_path), tmp_path / "second.png")  # sent before the death is noticed
    figures.close()
    assert not figures.in_background  # drawn here, from the one it died on
    for name in ("first.png", "second.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG, name
    figures.draw("plot_results", _csv(tmp_path), tmp_path / "third.png")  # the rest: drawn here
    assert (tmp_path / "third.png").read_bytes()[:8] == PNG
    lines = [line for line in capsys.readouterr().err.splitlines() if "helper" in line]
    assert len(lines) == 1 and lines[0].startswith("warning: drawing figures in a helper process failed")


def _broken(*args):
    raise ValueError("no font")


def test_a_figure_that_fails_is_one_line_and_the_helper_draws_the_next(tmp_path: Path, monkeypatch, capsys,
                                                                       watchdog) -> None:
    monkeypatch.setattr(detector.plots, "plot_confusion_matrix", _broken)  # in the helper too: forked after this
    figures = FigureWorker(background=True)
    figures.start()
    figures.draw("plot_confusion_matrix", None, ["a"], tmp_path / "confusion_matrix.png")
    figures.draw("plot_results", _csv(tmp_path), tmp_path / "results.png")
    figures.close()
    assert figures.in_background and sorted(figures.seconds) == ["plot_results"]  # the helper drew it, and lived on
    assert (tmp_path / "results.png").read_bytes()[:8] == PNG and not (tmp_path / "confusion_matrix.png").exists()
    err = capsys.readouterr().err.splitlines()
    assert err == ["warning: plot_confusion_matrix: not drawn (ValueError: no font)"]


def _slow(*args):
    import time

    time.sleep(60)


def test_a_ctrl_c_while_waiting_for_the_figures_kills_the_helper(tmp_path: Path, monkeypatch, watchdog) -> None:
    import multiprocessing
    import time

    monkeypatch.setattr(detector.plots, "plot_results", _slow)
    children = set(multiprocessing.active_children())
    figures = FigureWorker(background=True)
    figures.start()
    figures.draw("plot_results", _csv(tmp_path), tmp_path / "results.png")

    def interrupted(timeout: float):
        raise KeyboardInterrupt

    monkeypatch.setattr(figures.helper, "receive", interrupted)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        figures.close()
    assert time.monotonic() - started < 3 and not set(multiprocessing.active_children()) - children


def test_only_gpu_runs_on_hosts_with_cores_to_spare_draw_in_a_helper(monkeypatch) -> None:
    import torch

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert not figures_in_background(cuda, forked.HELPER_MIN_CORES - 1)
    assert figures_in_background(cuda, forked.HELPER_MIN_CORES)
    assert not figures_in_background(cpu, 64)  # a CPU run's step uses every core
    monkeypatch.setattr(worker_module, "fork_available", lambda: False)  # Windows, a daemonic process
    assert not figures_in_background(cuda, 64)


def test_a_send_cut_short_stops_the_helper_at_close_without_waiting(tmp_path: Path, monkeypatch, watchdog) -> None:
    """A Ctrl-C in the middle of a send leaves the answers out of step with what waits: close must not wait for an
    answer that may never come (300 s a figure)."""
    import multiprocessing
    import time

    children = set(multiprocessing.active_children())
    figures = FigureWorker(background=True)
    figures.start()

    def cut_short(job):
        raise KeyboardInterrupt

    real_send, figures.helper.send = figures.helper.send, cut_short
    with pytest.raises(KeyboardInterrupt):
        figures.draw("plot_results", _csv(tmp_path), tmp_path / "results.png")
    figures.helper.send = real_send
    started = time.monotonic()
    figures.close()
    assert time.monotonic() - started < 3 and not set(multiprocessing.active_children()) - children


def test_a_run_without_plots_forks_nothing(tiny_split) -> None:
    from detector.plots.reporter import RunReporter

    reporter = RunReporter(Path("/nonexistent"), ["a"], plots=False, tensorboard=False, background=True)
    reporter.start(tiny_split)
    assert reporter.figures.helper is None
    reporter.close()


def test_a_run_whose_helper_draws_has_every_figure_and_tensorboard_them(yolo_yaml: Path, tmp_path: Path,
                                                                        monkeypatch, watchdog) -> None:
    """The trainer forks the helper at its start and waits for it at its end: every figure is on disk when train
    returns, and TensorBoard logs them after that wait."""
    pytest.importorskip("tensorboard")
    from detector.plots.tensorboard import TensorBoardLogger
    from detector.training.config import TrainConfig
    from detector.training.trainer import train

    import detector.training.trainer as trainer_module

    monkeypatch.setattr(trainer_module, "figures_in_background", lambda device, cores: True)  # as on a GPU host
    logged, closed = [], []
    real_close = FigureWorker.close
    monkeypatch.setattr(FigureWorker, "close", lambda self: closed.append(self.in_background) or real_close(self))
    monkeypatch.setattr(TensorBoardLogger, "image", lambda self, tag, png, step: logged.append(png.read_bytes()[:8]))
    config = TrainConfig(data=str(yolo_yaml), device="cpu", imgsz=64, epochs=1, batch=4, workers=0, cache="none",
                         project=str(tmp_path), name="run", plots=True, tensorboard=True, amp_check=False,
                         close_mosaic=0, seed=0)
    run_dir = train(config, progress=False)["run_dir"]
    assert closed and closed[0] is True  # drawn by the helper
    for name in ("labels", "train_batch0", "results", "PR_curve", "confusion_matrix", "confusion_matrix_normalized",
                 "val_batch0_pred"):
        assert (run_dir / f"{name}.png").read_bytes()[:8] == PNG, name
    assert logged == [PNG] * 7  # every figure, each complete when TensorBoard read it
