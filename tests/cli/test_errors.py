"""run_command (detector/cli/errors.py): every command's errors end as one stderr line and one exit code."""

from __future__ import annotations

import gc
import pickle
import warnings

import pytest
import torch

from detector.checkpoint import CheckpointError
from detector.cli import download as download_command
from detector.cli.errors import CommandFailed, run_command, uncollected_imports
from detector.data import download as dataset_download
from detector.data.transfer import DownloadError
from detector.data.spec import DatasetError
from detector.exporting import ExportError
from detector.extras import Unavailable

USER_ERRORS = [
    CheckpointError("best.pt: not a checkpoint"),
    DatasetError("my.yaml: no 'val' split"),
    DownloadError("http://host/coco128.zip: HTTP 404 Not Found"),
    ValueError("--epochs must be at least 1 (got 0)"),
    FileNotFoundError("images/: no such image, folder or video"),
    PermissionError(13, "Permission denied", "runs/predict"),  # an output folder that cannot be written
    FloatingPointError("training diverged; lower --lr0"),
    pickle.UnpicklingError("best.pt: refuses to load global"),
    ExportError("onnx export failed the parity check; nothing was written"),
    Unavailable("pt2 export compiles C++ and needs a compiler at export time (g++); none is on PATH"),
    CommandFailed("the unamp run failed (its error is above)"),
]


def raise_(error: BaseException) -> None:
    raise error


@pytest.mark.parametrize("error", USER_ERRORS, ids=lambda error: type(error).__name__)
def test_a_user_error_is_one_line_and_exit_1(error: Exception, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_command(raise_, error) == 1
    captured = capsys.readouterr()
    assert captured.err == f"error: {error}\n" and captured.out == ""


def test_a_message_over_several_lines_is_joined_into_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_command(raise_, torch.cuda.OutOfMemoryError("CUDA out of memory.\nTried to allocate 2 GiB.\n")) == 1
    assert capsys.readouterr().err == "error: CUDA out of memory.; Tried to allocate 2 GiB.\n"


@pytest.mark.parametrize("interrupt,message", [
    (KeyboardInterrupt(), "interrupted"),
    (KeyboardInterrupt("interrupted; run it again to resume"), "interrupted; run it again to resume"),
])
def test_ctrl_c_is_one_line_and_exit_130(interrupt: KeyboardInterrupt, message: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert run_command(raise_, interrupt) == 130
    assert capsys.readouterr().err.strip().splitlines() == [f"error: {message}"]


def test_a_sigterm_a_command_unwinds_from_exits_143_not_130(capsys: pytest.CaptureFixture[str]) -> None:
    """128 + SIGTERM, as a shell reports a process the signal killed: Ctrl-C's 130 told a scheduler the wrong one."""
    from detector.cli.errors import Terminated

    assert run_command(raise_, Terminated("terminated (SIGTERM); run it again")) == 143
    assert capsys.readouterr().err.strip().splitlines() == ["error: terminated (SIGTERM); run it again"]


def test_under_torchrun_a_node_s_other_ranks_wait_before_their_error_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A --data that is missing was printed once per rank. The node's first rank prints at once; the others wait,
    for torchrun to end them once the first has failed, and print (naming their rank) only if it did not."""
    from detector.cli import errors

    waits: list[float] = []
    monkeypatch.setattr(errors.time, "sleep", waits.append)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert run_command(raise_, ValueError("missing.yaml: data YAML not found")) == 1
    assert waits == [] and capsys.readouterr().err == "error: missing.yaml: data YAML not found\n"
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert run_command(raise_, ValueError("missing.yaml: data YAML not found")) == 1
    assert waits == [errors.PEER_ERROR_WAIT_S]
    assert capsys.readouterr().err == "error: rank 3: missing.yaml: data YAML not found\n"


def test_a_ctrl_c_in_the_peer_s_wait_still_prints_its_error_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A Ctrl-C while a rank waited to print its error (rank 0 blocked in a collective, the user impatient) raised
    out of the except clause: a chained traceback of both, and the error's line lost."""
    from detector.cli import errors

    def interrupted(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(errors.time, "sleep", interrupted)
    for name, value in {"TORCHELASTIC_RUN_ID": "job", "WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}.items():
        monkeypatch.setenv(name, value)
    assert run_command(raise_, ValueError("out of memory on this rank")) == 1
    assert capsys.readouterr().err == "error: rank 1: out of memory on this rank\n"


def test_only_torchrun_s_processes_wait_to_print_an_error(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Another launcher that sets LOCAL_RANK (an srun recipe) kills no peer when one fails: its processes printed
    their error 10 s late for nothing. Only torchrun's agent (TORCHELASTIC_RUN_ID) ends them."""
    from detector.cli import errors

    waits: list[float] = []
    monkeypatch.setattr(errors.time, "sleep", waits.append)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    for name, value in {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}.items():
        monkeypatch.setenv(name, value)
    assert run_command(raise_, ValueError("missing.yaml: data YAML not found")) == 1
    assert waits == [] and capsys.readouterr().err == "error: missing.yaml: data YAML not found\n"


def test_ctrl_c_while_torch_imports_is_one_line_too(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The first second or two of every command import torch (user_errors): a Ctrl-C there was a 30-line
    traceback."""
    from detector.cli import errors

    def importing() -> tuple:
        raise KeyboardInterrupt

    monkeypatch.setattr(errors, "user_errors", importing)
    assert run_command(print, "never") == 130
    assert capsys.readouterr().err.strip().splitlines() == ["error: interrupted"]


def test_success_is_0_and_a_bug_keeps_its_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_command(print, "done") == 0 and capsys.readouterr().out == "done\n"
    with pytest.raises(KeyError):
        run_command(raise_, KeyError("a bug, not a user error"))
    with pytest.raises(RuntimeError):  # torch's own errors (a shape mismatch, a device assert) are bugs here
        run_command(raise_, RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 4x3)"))


def test_an_interrupted_download_says_how_to_resume(tmp_path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(dataset_download, "download", interrupted)  # the command imports it when it runs
    assert download_command.main(["coco128", "--datasets-dir", str(tmp_path)]) == 130
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"error: interrupted; run the command again to resume (partial files in {tmp_path})"]


def test_every_command_prints_a_warning_as_one_plain_line() -> None:
    with warnings.catch_warnings():  # restores Python's formatter afterwards
        assert run_command(lambda: None) == 0
        text = warnings.formatwarning("bccd.yaml 'val': 3 box(es) slightly outside [0, 1], clipped", UserWarning,
                                      "/site-packages/detector/data/build.py", 39, "scan.problems.warn(...)")
    assert text == "warning: bccd.yaml 'val': 3 box(es) slightly outside [0, 1], clipped\n"


class Cycle:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_heavy_imports_run_without_the_collector_and_stay_frozen() -> None:
    passes: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            passes.append(info["generation"])

    enabled, frozen = gc.isenabled(), gc.get_freeze_count()
    gc.callbacks.append(count)
    try:
        with uncollected_imports():
            made = [Cycle() for _ in range(20 * gc.get_threshold()[0])]  # 20 times what starts a young pass
            assert not gc.isenabled()
        assert passes == []
        assert gc.isenabled() == enabled  # restored, whatever it was
        assert gc.get_freeze_count() >= frozen + len(made)  # what lived through the block is frozen
    finally:
        gc.callbacks.remove(count)


@pytest.mark.parametrize("command", ["val", "predict", "export", "benchmark"])
def test_a_one_process_command_under_torchrun_is_refused_once(command: str, monkeypatch, capsys) -> None:
    """Each torchrun process ran the whole command, into runs/val/exp and exp2; now the first says why, once."""
    import importlib

    main = importlib.import_module(f"detector.cli.{command}").main
    argv = {"val": ["--weights", "w.pt", "--data", "d.yaml"], "predict": ["--source", "x.jpg"]}.get(command, [])
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank, says in (("0", True), ("1", False)):
        monkeypatch.setenv("RANK", rank)
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert (err == f"error: {command} runs in one process: start it with python (or detector {command}), not "
                "torchrun; only train shares its work among processes\n") is says and (says or err == "")
