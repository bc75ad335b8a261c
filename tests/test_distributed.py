"""torchrun on CPU (gloo), with the default flags: the AMP check on and the precision chosen automatically.

Every launch has a timeout, so a hang (mismatched collectives) fails the test instead of stalling CI.
Ports: ``--standalone`` makes torchrun pick a free one; the two-node test asks the OS for one.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import pytest

from detector.checkpoint import load_checkpoint

ROOT = Path(__file__).resolve().parents[1]
LAUNCH_TIMEOUT = 240  # seconds; a 2-process run of these tiny datasets takes ~20 s on 2 busy cores
# Tiny, fast and deterministic; everything else (AMP check, precision, plots off for speed) at its default.
COMMON = ["--imgsz", "64", "--workers", "0", "--cache", "none", "--no-plots", "--no-multi-scale",
          "--warmup-epochs", "0", "--device", "cpu"]

# Under torchrun, wraps the training entry point: on rank 1 only, during epoch 2 only, the loss becomes NaN.
# Rank 0 sees the resulting non-finite (all-reduced) gradients; the decision to fall back must reach rank 1.
# Each rank then writes what it ended with, so the test can see that all ranks agree.
INJECT_NAN = """
import json, os, sys, torch
import detector.loss, detector.training.trainer
from detector.cli.train import build_parser
from detector.training.config import TrainConfig
from detector.distributed import unwrap
from dataclasses import fields

RANK = int(os.environ["RANK"])
state = {"epoch": -1}
original_epoch, original_loss = detector.training.trainer.train_one_epoch, detector.loss.DetectionLoss.forward

def train_one_epoch(*args, **kwargs):
    state["epoch"] = kwargs["epoch"]
    return original_epoch(*args, **kwargs)

def forward(self, *args, **kwargs):
    total, parts = original_loss(self, *args, **kwargs)
    if RANK == 1 and state["epoch"] == 1:
        total = total * float("nan")
    return total, parts

detector.training.trainer.train_one_epoch, detector.loss.DetectionLoss.forward = train_one_epoch, forward
args = build_parser().parse_args(sys.argv[1:])
trainer = detector.training.trainer.Trainer(TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)}),
                                   progress=False)
summary = trainer.fit()
weights = sum(float(p.double().abs().sum()) for p in unwrap(trainer.step.model).parameters())
out = os.path.join(str(summary["run_dir"]), f"rank{RANK}.json")
json.dump({"precision": trainer.step.precision.name, "epochs_done": summary["epochs_done"], "weights": weights,
           "metrics": summary["metrics"], "best_epoch": summary.get("best_epoch")}, open(out, "w"))
"""


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def _run(args: list[str], cwd: Path, **env: str) -> str:
    result = subprocess.run(args, cwd=cwd, env={**_env(), **env}, capture_output=True, text=True,
                            timeout=LAUNCH_TIMEOUT)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return result.stdout


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *args]


def _rows(run_dir: Path) -> list[dict[str, str]]:
    return list(csv.DictReader((run_dir / "results.csv").open()))


def _total(row: dict[str, str]) -> float:
    return sum(float(row[c]) for c in ("train/box", "train/cls", "train/dfl"))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """One process with batch 4, and 2 processes with batch 2 each (same global batch), 2 epochs each."""
    from tests.conftest import write_yolo_dataset

    root = tmp_path_factory.mktemp("ddp")
    data = write_yolo_dataset(root / "data")
    common = [str(ROOT / "train.py"), "--data", str(data), *COMMON, "--epochs", "2", "--project", str(root)]
    _run([sys.executable, *common, "--batch", "4", "--name", "single"], root)
    # The RAM cache holds the very pixels a decode gives, so caching changes no number; here the node's two
    # processes share one copy of it.
    # --cuda-graphs on: its "off" line (no CUDA here, and not under torchrun) comes once, not once a rank.
    output = _run(_torchrun(*common, "--batch", "2", "--name", "ddp", "--cache", "ram", "--cuda-graphs", "on"), root)
    assert output.count("cuda graphs: off") == 1
    assert "AMP check" in output or "precision fp32" in output  # the check ran (or had nothing to check)
    assert "RAM cache 0.1 MiB shared by the 2 processes of this node" in output  # 8 images x 64 x 64 x 3
    assert not list(Path(tempfile.gettempdir()).glob("detector-image-cache-*"))  # its file name is gone
    return {"root": root, "data": data, "single": root / "single", "ddp": root / "ddp"}


def test_two_processes_with_default_flags_match_one_process(runs):
    single, ddp = _rows(runs["single"]), _rows(runs["ddp"])
    assert not (runs["root"] / "ddp2").exists()  # only rank 0 made a run folder
    assert [r["epoch"] for r in ddp] == ["1", "2"] and ddp[0]["precision"] == single[0]["precision"]
    # Same images per step. BatchNorm sees 2 images per rank instead of 4, which moves the predictions and
    # so the few positive anchors of these tiny images: box/DFL terms wander, the dominant class term and
    # the total stay close. (Before the loss was normalised over the global batch, cls was off by 2x.)
    assert abs(float(single[0]["train/cls"]) - float(ddp[0]["train/cls"])) <= 0.1 * float(single[0]["train/cls"])
    assert abs(_total(single[0]) - _total(ddp[0])) <= 0.15 * _total(single[0])


def test_two_nodes_on_one_machine_train_like_two_local_processes(runs):
    """``torchrun --nnodes 2 --nproc_per_node 1`` twice, c10d rendezvous on localhost."""
    root, port = runs["root"], _free_port()
    common = [str(ROOT / "train.py"), "--data", str(runs["data"]), *COMMON, "--epochs", "2", "--batch", "2",
              "--project", str(root), "--name", "nodes"]
    launch = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
              "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "nodes-test"]
    nodes = [subprocess.Popen([*launch, *common], cwd=root, env=_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    try:
        outputs = [node.communicate(timeout=LAUNCH_TIMEOUT)[0] for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    assert all(node.returncode == 0 for node in nodes), "\n".join(output[-2000:] for output in outputs)
    two_nodes, two_local = _rows(root / "nodes"), _rows(runs["ddp"])
    assert not (root / "nodes2").exists()
    # The same two shards of the same global batch, on the same arithmetic (one thread per process): the only
    # freedom is which process got which rank, and a sum of two gradients is the same in either order
    # (IEEE addition commutes). So the runs must agree to the digits results.csv keeps (6 significant).
    for node_row, local_row in zip(two_nodes, two_local):
        for column in ("train/box", "train/cls", "train/dfl", "mAP50-95"):
            assert float(node_row[column]) == pytest.approx(float(local_row[column]), rel=1e-5, abs=1e-6), column


def test_fallback_on_one_rank_is_taken_by_every_rank(runs, tmp_path):
    """A NaN loss on rank 1 in epoch 2: all ranks switch BF16 -> FP32 together and train on in lockstep."""
    script = tmp_path / "inject.py"
    script.write_text(INJECT_NAN)
    _run(_torchrun(str(script), "--data", str(runs["data"]), *COMMON, "--epochs", "3", "--batch", "2",
                   "--precision", "bf16", "--project", str(tmp_path), "--name", "fallback"), tmp_path)
    run_dir = tmp_path / "fallback"
    rows = _rows(run_dir)
    assert [row["precision"] for row in rows] == ["bf16", "bf16", "fp32"]
    # Rank 0's own losses stayed finite: the row (rank 0's) counts rank 1's, so the decision saw them.
    assert [int(row["nonfinite_losses"]) > 0 for row in rows] == [False, True, False]
    ranks = [json.loads((run_dir / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["precision"] for r in ranks] == ["fp32", "fp32"] and [r["epochs_done"] for r in ranks] == [3, 3]
    # DDP keeps replicas identical only if both ranks step with the same precision and the same skips.
    assert ranks[0]["weights"] == ranks[1]["weights"]
    # Every rank's train() returns best.pt's final report, rank 0's (the others returned the last epoch's).
    assert ranks[0]["best_epoch"] is not None and ranks[1]["best_epoch"] == ranks[0]["best_epoch"]
    assert ranks[1]["metrics"] == ranks[0]["metrics"] and "mAP50-95" in ranks[0]["metrics"]
    assert load_checkpoint(run_dir / "weights" / "last.pt")["precision"] == "fp32"


# torchrun's own race (torch/distributed/elastic/metrics/api.py): a signal that lands between the metrics wrapper's
# ``try:`` and its ``start = time.time()`` raises UnboundLocalError in its ``finally`` instead of the launcher's
# SignalException, and the launcher then ends its ranks without the Ctrl-C they would handle. Seen once under a
# loaded CI run; the launcher's code, not ours, so the test interrupts afresh when the launcher says so.
LAUNCHER_RACE = "UnboundLocalError: cannot access local variable 'start'"


def _interrupted_run(data: Path, project: Path) -> str:
    """A 5-epoch torchrun run interrupted (SIGINT to the launcher) once its first epoch is saved; its output."""
    process = subprocess.Popen(
        _torchrun(str(ROOT / "train.py"), "--data", str(data), *COMMON, "--epochs", "5", "--batch", "2",
                  "--project", str(project)),
        cwd=project, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    last = project / "exp" / "weights" / "last.pt"
    deadline = time.time() + LAUNCH_TIMEOUT
    while not last.exists() and time.time() < deadline and process.poll() is None:
        time.sleep(0.1)
    process.send_signal(signal.SIGINT)  # during epoch 2: the ranks finish it, agree to stop, rank 0 saves
    try:
        output, _ = process.communicate(timeout=LAUNCH_TIMEOUT)
    finally:
        process.kill()
    return output


def test_ctrl_c_to_the_launcher_stops_every_rank_after_the_epoch_and_the_run_resumes(runs, tmp_path):
    output = _interrupted_run(runs["data"], tmp_path)
    if LAUNCHER_RACE in output:  # torchrun's race, above: once more, in a folder of its own
        tmp_path = tmp_path / "again"
        tmp_path.mkdir()
        output = _interrupted_run(runs["data"], tmp_path)
    last = tmp_path / "exp" / "weights" / "last.pt"
    assert "interrupted: saved" in output, output[-3000:]
    state = load_checkpoint(last)
    assert 1 <= state["epoch"] < 4 and len(_rows(tmp_path / "exp")) == state["epoch"] + 1

    _run(_torchrun(str(ROOT / "train.py"), "--resume", str(last), "--device", "cpu", "--workers", "0"), tmp_path)
    assert load_checkpoint(last)["epoch"] == 4
    assert [row["epoch"] for row in _rows(tmp_path / "exp")] == ["1", "2", "3", "4", "5"]


def test_a_bad_input_error_under_torchrun_is_printed_once(tmp_path):
    """A --data that does not exist was printed by each rank: the node's first prints it, torchrun ends the other
    while it waits (detector/cli/errors.py)."""
    result = subprocess.run(_torchrun(str(ROOT / "train.py"), "--data", "missing.yaml", "--device", "cpu"),
                            cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=LAUNCH_TIMEOUT)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "missing.yaml: data YAML not found" in errors[0], result.stderr[-3000:]


def test_more_cuda_processes_than_gpus_stop_in_one_line_before_any_collective(monkeypatch, capsys):
    """Two ranks on one visible GPU would meet NCCL's duplicate-GPU failure (or a hang) at their first collective:
    the node's first rank raises one line, the other exits quietly. Nothing here touches CUDA: the device and the
    GPU count are given, and the check runs before either is used."""
    import torch

    import detector.distributed
    from detector.cli.errors import run_command
    from detector.distributed import DistributedSetupError, gpu_shortage, init_distributed

    assert gpu_shortage(2, 2) is None and gpu_shortage(1, 1) is None
    monkeypatch.setattr(detector.distributed, "resolve_device", lambda request: torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: pytest.fail("CUDA touched before the check"))
    for name, value in {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(DistributedSetupError):
        init_distributed("cuda")
    assert run_command(init_distributed, "cuda") == 1
    assert capsys.readouterr().err == (
        "error: torchrun started 2 processes on this node but 1 GPU is visible, and CUDA training needs one GPU per "
        "process: use --nproc_per_node 1, or --device cpu (gloo)\n")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(SystemExit) as quiet:
        init_distributed("cuda")
    assert quiet.value.code == 1 and capsys.readouterr().err == ""


def test_a_gpu_index_under_torchrun_is_named_as_unused_once(monkeypatch):
    """``--device cuda:1`` under torchrun: each process takes its local rank's GPU, and the first says so."""
    import torch

    import detector.distributed
    from detector.distributed import init_distributed

    chosen = []
    monkeypatch.setattr(detector.distributed, "resolve_device", lambda request: torch.device(request))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setattr(detector.distributed.dist, "is_initialized", lambda: True)  # no process group here
    for name, value in {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    with pytest.warns(UserWarning, match=r"--device cuda:1: under torchrun each process takes the GPU of its local "
                                         r"rank \(cuda:0 to cuda:1\); choose the GPUs with CUDA_VISIBLE_DEVICES"):
        init_distributed("cuda:1")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the other ranks stay quiet, as does cuda:0 on the first
        init_distributed("cuda:1")
        monkeypatch.setenv("LOCAL_RANK", "0")
        init_distributed("cuda:0")
    assert chosen == [torch.device("cuda", 0), torch.device("cuda", 1), torch.device("cuda", 0)]


def test_the_amp_checks_private_model_has_no_sync_batchnorm():
    """--sync-bn under torchrun: rank 0 runs the AMP check alone, and a SyncBatchNorm in training mode would start
    a collective the other ranks never join. The check's model has plain BatchNorm2d layers, the same numbers."""
    import torch

    from detector.distributed import without_sync_batchnorm
    from detector.model import build_model

    model = build_model(num_classes=3)
    assert without_sync_batchnorm(model) is model  # nothing to replace: no copy
    synced = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model).train()
    plain = without_sync_batchnorm(synced)
    kinds = {type(module) for module in plain.modules()}
    assert torch.nn.SyncBatchNorm not in kinds and torch.nn.BatchNorm2d in kinds and plain.training
    assert any(isinstance(module, torch.nn.SyncBatchNorm) for module in synced.modules())  # the run's own is kept
    for (name, value), (other, expected) in zip(plain.state_dict().items(), synced.state_dict().items(), strict=True):
        assert name == other and torch.equal(value, expected), name


def test_ranks_wait_for_rank_zeros_long_work_for_hours(monkeypatch):
    """NCCL's default 10 minutes at a collective would end a job while rank 0 caches a large set or validates."""
    from datetime import timedelta

    import torch.distributed

    from detector.distributed import init_distributed

    calls = []
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda **kwargs: calls.append(kwargs))
    for name, value in {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}.items():
        monkeypatch.setenv(name, value)
    info, device = init_distributed("cpu")
    assert info.world_size == 2 and device.type == "cpu"
    assert len(calls) == 1 and calls[0]["backend"] == "gloo" and calls[0]["timeout"] >= timedelta(hours=1)


def test_a_cuda_process_group_is_bound_to_the_processs_own_gpu(monkeypatch):
    """The second of two nodes, two processes each on 4-GPU machines: global rank 2 is local rank 0 and trains on
    cuda:0. Unbound, NCCL's first barrier would guess cuda:(2 % 4) = cuda:2 and hang. Only the arguments are checked
    here: no GPU or NCCL runs."""
    import torch.distributed

    import detector.distributed
    from detector.distributed import init_distributed

    calls = []
    monkeypatch.setattr(detector.distributed, "resolve_device", lambda request: torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda **kwargs: calls.append(kwargs))
    for name, value in {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "RANK": "2", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    info, device = init_distributed("cuda")
    assert device == torch.device("cuda", 0) and info.rank == 2
    assert len(calls) == 1 and calls[0]["backend"] == "nccl" and calls[0]["device_id"] == torch.device("cuda", 0)


class _Unpicklable(Exception):
    """An error holding what does not pickle (a lock), as a library's error may hold a handle."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        import threading

        self.lock = threading.Lock()


class _TwoArguments(Exception):
    """An error whose ``__init__`` takes more than its ``args`` hold: unpickling calls it with ``args`` alone."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")


def test_rank_0s_error_reaches_the_others_even_when_it_does_not_pickle(monkeypatch):
    """decide_on_main broadcasts rank 0's error (pickled): one that does not survive pickling goes as a RuntimeError
    of its type and message, and rank 0 raises its own, with its traceback."""
    import pickle

    import detector.distributed as distributed
    from detector.distributed import DistInfo, decide_on_main, portable

    plain = ValueError("epoch 3: loss is NaN")
    assert portable(plain) is plain
    for error, line in ((_Unpicklable("disk gone"), "_Unpicklable: disk gone"),
                        (_TwoArguments("a.jpg", "truncated"), "_TwoArguments: a.jpg: truncated")):
        with pytest.raises(Exception):
            pickle.loads(pickle.dumps(error))  # what the broadcast did to it before
        sent = portable(error)
        assert type(sent) is RuntimeError and str(sent) == line and pickle.loads(pickle.dumps(sent)).args == (line,)

    broadcast = []  # rank 0 of two: what the broadcast pickles and the others would get
    monkeypatch.setattr(distributed, "broadcast_from_main",
                        lambda value, info: broadcast.append(pickle.loads(pickle.dumps(value))) or value)

    def fail():
        raise _Unpicklable("disk gone")

    with pytest.raises(_Unpicklable, match="disk gone"):
        decide_on_main(fail, DistInfo(rank=0, world_size=2))
    assert broadcast[0][0] is False and str(broadcast[0][1]) == "_Unpicklable: disk gone"
    assert decide_on_main(lambda: 7, DistInfo(rank=0, world_size=2)) == 7


def test_a_set_up_that_fails_ends_the_process_group_it_started(monkeypatch, tmp_path):
    """Under torchrun a run whose set-up fails (here its data YAML is missing) leaves no process group behind for a
    Python caller; one the caller had started before is left running. A real gloo group of one process stands in
    for torchrun's (WORLD_SIZE says 2, so the run joins a group; the group it makes has this process alone)."""
    import torch.distributed as dist

    from detector.training.config import TrainConfig
    from detector.training.trainer import train

    if dist.is_initialized():
        pytest.skip("a process group is already running in this process")
    real_init = dist.init_process_group

    def alone(**kwargs):
        real_init(backend="gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)

    monkeypatch.setattr(dist, "init_process_group", alone)
    for name, value in {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    config = TrainConfig(data=str(tmp_path / "missing.yaml"), device="cpu", project=str(tmp_path), epochs=1)
    with pytest.raises(Exception, match="missing.yaml"):
        train(config, progress=False)
    assert not dist.is_initialized()

    alone()  # the caller's own group, running before the run
    try:
        with pytest.raises(Exception, match="missing.yaml"):
            train(config, progress=False)
        assert dist.is_initialized()
    finally:
        dist.destroy_process_group()


def test_ranks_train_in_the_safest_precision_any_of_them_resolved(monkeypatch):
    """--precision bf16 over GPUs of two generations: the rank whose GPU lacks native BF16 resolves FP32, and every
    rank trains in FP32; rank 0's choice on a tie; one process keeps its own. The ranks' answers are given here (no
    group runs): what is checked is the choice among them."""
    import torch.distributed as dist

    from detector.distributed import DistInfo, agreed_precision
    from detector.precision import Precision

    bf16, fp32 = Precision("bf16", "cuda", "requested"), Precision("fp32", "cuda", "this GPU has no native BF16")
    assert agreed_precision(bf16, DistInfo(0, 0, 1, 1)) is bf16
    for answers, expected in (([bf16, fp32], fp32), ([fp32, bf16], fp32), ([bf16, bf16], bf16)):
        monkeypatch.setattr(dist, "all_gather_object", lambda every, mine, given=answers: every.__setitem__(
            slice(None), given))
        assert agreed_precision(answers[1], DistInfo(1, 1, 2, 2)) is expected


def test_a_group_the_run_started_stays_for_the_processs_next_run(tmp_path, monkeypatch):
    """train() twice in one torchrun process: the first run's group serves the second, and ends at exit. A group
    destroyed after each run and made anew on torchrun's store hung 3 launches in 5 (the old group's keys)."""
    import torch.distributed as dist

    import detector.distributed
    from detector.data.synthetic import generate_shapes
    from detector.training.config import TrainConfig
    from detector.training.trainer import train

    if dist.is_initialized():
        pytest.skip("a process group is already running in this process")
    real_init, made = dist.init_process_group, []

    def alone(**kwargs):
        made.append(1)
        real_init(backend="gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)

    monkeypatch.setattr(dist, "init_process_group", alone)
    exits, register = [], detector.distributed.atexit.register  # the module's own registrations pass through
    monkeypatch.setattr(detector.distributed.atexit, "register",
                        lambda function, *args: exits.append(function) if function is detector.distributed.end_group
                        else register(function, *args))
    for name, value in {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    data = generate_shapes(tmp_path / "shapes", train=8, val=4, size=64)
    config = dict(data=str(data), device="cpu", imgsz=64, epochs=1, batch=4, workers=0, plots=False,
                  amp_check=False, project=str(tmp_path / "runs"))
    try:
        for name in ("a", "b"):
            train(TrainConfig(**config, name=name), progress=False)
            assert dist.is_initialized()
        assert made == [1] and exits == [detector.distributed.end_group]
        detector.distributed.end_group()
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
