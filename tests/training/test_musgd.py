"""MuSGD (detector/training/musgd.py) against Ultralytics 8.4's own, the reference a dev extra brings: its trainer's
parameter groups and its steps on one small model, the same gradients, in a child process (importing Ultralytics
patches this one for good). Then what the schedule, a checkpoint and a short run do with it."""

from __future__ import annotations

import csv
import importlib.util
import io
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from detector.training.engine import StepSchedule, set_learning_rates
from detector.training.musgd import MUON_FACTOR, MuSGD, orthogonalise
from detector.training.optim import build_optimizer

# Every Muon matrix has its own column count (27, 72, 4, 20, 12, 108, 6), so Ultralytics' batching by columns pads
# nothing and runs each one alone, as ours does: the same BF16 ops in the same order. ``tall`` is taller than wide
# (the transposed iteration, scale 2), ``gain`` a 1-D weight that is not a norm's (decayed SGD), ``dfl`` frozen.
TINY = """
import torch
from torch import nn

class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.cv2 = nn.Conv2d(12, 16, 1)
        self.cv3 = nn.Sequential(nn.Conv2d(12, 6, 3, bias=False), nn.BatchNorm2d(6), nn.Conv2d(6, 3, 1))
        self.dfl = nn.Conv2d(16, 1, 1, bias=False).requires_grad_(False)

class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8))
        self.gain = nn.Parameter(torch.ones(8))
        self.neck = nn.Conv2d(8, 12, 3)
        self.tall = nn.Linear(4, 16)
        self.wide = nn.Linear(20, 3)
        self.head = Head()
        self.model = [self.head]  # a plain list, not a submodule: Ultralytics' trainer reads model.model[-1]
"""
exec(TINY)  # noqa: S102 - the same class here and in the child, so parameter i is the same tensor in both

# The child: Ultralytics' trainer builds MuSGD's groups for Tiny, then steps it with the saved gradients.
ORACLE = TINY + """
import sys, types
from ultralytics.engine.trainer import BaseTrainer

case = torch.load(sys.argv[1])
model = Tiny()
model.load_state_dict(case["state"])
trainer = types.SimpleNamespace(args=types.SimpleNamespace(), data={})
optimizer = BaseTrainer.build_optimizer(trainer, model, name="MuSGD", lr=case["lr"], momentum=case["momentum"],
                                        decay=case["decay"])
params = list(model.parameters())
index = {id(p): i for i, p in enumerate(params)}
groups = [{"params": sorted(index[id(p)] for p in g["params"]), "lr": g["lr"], "momentum": g["momentum"],
           "weight_decay": g["weight_decay"], "use_muon": g["use_muon"]} for g in optimizer.param_groups]
base = [g["lr"] for g in optimizer.param_groups]
after = []
for grads, factor, momentum in zip(case["grads"], case["lr_factors"], case["momenta"]):
    for group, lr in zip(optimizer.param_groups, base):
        group["lr"], group["momentum"] = lr * factor, momentum
    for param, grad in zip(params, grads):
        param.grad = None if grad is None else grad.clone()
    optimizer.step()
    after.append([p.detach().clone() for p in params])
torch.save({"groups": groups, "after": after, "muon": optimizer.muon, "sgd": optimizer.sgd}, sys.argv[2])
"""

LR, MOMENTUM, DECAY = 0.01, 0.937, 5e-4
LR_FACTORS, MOMENTA = (0.2, 0.6, 1.0), (0.8, 0.85, 0.937)  # a warm-up's changes between steps, the same in both


def run_oracle(tmp_path: Path, case: dict) -> dict:
    torch.save(case, tmp_path / "case.pt")
    env = {**os.environ, "YOLO_OFFLINE": "1", "YOLO_CONFIG_DIR": str(tmp_path),
           "OMP_NUM_THREADS": str(torch.get_num_threads())}
    done = subprocess.run([sys.executable, "-c", ORACLE, str(tmp_path / "case.pt"), str(tmp_path / "out.pt")],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return torch.load(tmp_path / "out.pt")


@pytest.mark.skipif(importlib.util.find_spec("ultralytics") is None, reason="needs the ultralytics dev extra")
def test_musgd_groups_and_steps_match_ultralytics(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Tiny()  # noqa: F821 - defined by exec(TINY)
    params = list(model.parameters())
    grads = [[torch.randn_like(p) if p.requires_grad else None for p in params] for _ in LR_FACTORS]
    case = {"state": model.state_dict(), "lr": LR, "momentum": MOMENTUM, "decay": DECAY, "grads": grads,
            "lr_factors": LR_FACTORS, "momenta": MOMENTA}
    theirs = run_oracle(tmp_path, case)
    optimizer = build_optimizer(model, name="MuSGD", lr=LR, momentum=MOMENTUM, weight_decay=DECAY, num_classes=3,
                                total_steps=10).optimizer
    assert (optimizer.muon, optimizer.sgd) == (theirs["muon"], theirs["sgd"]) == (0.2, 1.0)
    index = {id(p): i for i, p in enumerate(params)}
    frozen = {i for i, p in enumerate(params) if not p.requires_grad}  # in their Muon group, never stepped; not in ours
    ours = [{"params": sorted(index[id(p)] for p in g["params"]), "lr": g["lr"], "momentum": g["momentum"],
             "weight_decay": g["weight_decay"], "use_muon": g["use_muon"]} for g in optimizer.param_groups]
    expected = [{**g, "params": [i for i in g["params"] if i not in frozen]} for g in theirs["groups"]]
    key = lambda group: group["params"]  # noqa: E731
    assert sorted(ours, key=key) == sorted([g for g in expected if g["params"]], key=key)
    base = [g["lr"] for g in optimizer.param_groups]
    for step, (step_grads, factor, momentum) in enumerate(zip(grads, LR_FACTORS, MOMENTA)):
        for group, lr in zip(optimizer.param_groups, base):
            group["lr"], group["momentum"] = lr * factor, momentum
        for param, grad in zip(params, step_grads):
            param.grad = None if grad is None else grad.clone()
        optimizer.step()
        # Exactly equal: both run the same ops in the same order, float32 SGD and momentum parts and BF16 Newton-
        # Schulz on one matrix at a time (see TINY), in processes with the same thread count. A matrix Ultralytics
        # batched with another of its column count would differ by BF16 round-off there; none does here.
        for i, (mine, reference) in enumerate(zip(params, theirs["after"][step])):
            assert torch.equal(mine.detach(), reference), f"step {step}, parameter {i}"


def test_orthogonalise_brings_singular_values_near_one() -> None:
    """Muon's quintic iteration aims at singular values in ~(0.5, 1.5), not exactly 1 (Keller Jordan's notes), for a
    wide and a tall matrix alike, from a gradient whose spectrum spans 1e-3..1."""
    torch.manual_seed(0)
    for rows, cols in ((16, 72), (72, 16)):
        left, _ = torch.linalg.qr(torch.randn(rows, rows))
        right, _ = torch.linalg.qr(torch.randn(cols, cols))
        spectrum = torch.logspace(-3, 0, min(rows, cols))
        matrix = left[:, : len(spectrum)] @ torch.diag(spectrum) @ right[: len(spectrum)]
        singular = torch.linalg.svdvals(orthogonalise(matrix[None]).float()[0])
        assert singular.min() > 0.3 and singular.max() < 1.6, singular


def _schedule(warmup_steps: int = 10) -> StepSchedule:
    return StepSchedule(epochs=10, steps_per_epoch=10, warmup_steps=warmup_steps, base_lr=LR, final_lr_fraction=0.01,
                        cosine=False, warmup_bias_lr=0.1, warmup_momentum=0.8, momentum=MOMENTUM, batch_size=16,
                        nominal_batch=16, clip_grad=10.0)


def test_class_branches_keep_3x_their_rate_through_warm_up_and_decay() -> None:
    """Ultralytics interpolates each group from its warm-up start to its own initial_lr x decay: the class branch's
    weights at 3x the others' every step, its biases from warmup_bias_lr to 3x the target; momentum the same for
    all groups. Muon takes every conv filter; norms and biases get plain SGD."""
    from detector.model import build_model

    model = build_model(num_classes=3, scale="n")
    optimizer = build_optimizer(model, name="MuSGD", lr=LR, momentum=MOMENTUM,
                                weight_decay=DECAY, num_classes=3, total_steps=100).optimizer
    assert isinstance(optimizer, MuSGD)
    muon = {id(p) for g in optimizer.param_groups if g["use_muon"] for p in g["params"]}
    assert muon == {id(p) for p in model.parameters() if p.requires_grad and p.ndim == 4}
    boosted = {id(p) for g in optimizer.param_groups if g["lr_scale"] == 3.0 for p in g["params"]}
    assert boosted == {id(p) for p in model.head.cv3.parameters()}
    schedule = _schedule()
    for step in (0, 5, 50, 99):
        values = set_learning_rates(optimizer, step, schedule)
        for group in optimizer.param_groups:
            scale, bias = group["lr_scale"], group["param_group"] == "bias"
            ramp = schedule.warmup_fraction(step)
            target = scale * schedule.base_lr * schedule.lr_factor(step)
            expected = 0.1 + ramp * (target - 0.1) if bias else ramp * target
            assert group["lr"] == pytest.approx(expected, rel=1e-12), (step, group["param_group"], scale)
            assert group["momentum"] == values.momentum


def _steps(optimizer: torch.optim.Optimizer, params: list[torch.Tensor], grads: list[list[torch.Tensor]]) -> None:
    for step_grads in grads:
        for param, grad in zip(params, step_grads):
            param.grad = grad.clone()
        optimizer.step()


def test_state_dict_round_trip_continues_the_same_steps() -> None:
    """A resumed MuSGD (its state_dict saved after 2 steps, loaded into a fresh one) takes the third step exactly as
    the uninterrupted one: both momentum buffers of a Muon parameter come back."""
    torch.manual_seed(0)
    model = Tiny()  # noqa: F821
    resumed_model = Tiny()  # noqa: F821
    resumed_model.load_state_dict(model.state_dict())
    params = [p for p in model.parameters() if p.requires_grad]
    grads = [[torch.randn_like(p) for p in params] for _ in range(3)]
    optimizer = build_optimizer(model, name="MuSGD", lr=LR, momentum=MOMENTUM, weight_decay=DECAY, num_classes=3,
                                total_steps=10).optimizer
    _steps(optimizer, params, grads[:2])
    saved = torch.load(_saved(optimizer.state_dict()), weights_only=True)
    resumed_model.load_state_dict(model.state_dict())
    resumed = build_optimizer(resumed_model, name="MuSGD", lr=LR, momentum=MOMENTUM, weight_decay=DECAY,
                              num_classes=3, total_steps=10).optimizer
    resumed.load_state_dict(saved)
    assert "momentum_buffer_SGD" in resumed.state[resumed_model.neck.weight]
    _steps(optimizer, params, grads[2:])
    _steps(resumed, [p for p in resumed_model.parameters() if p.requires_grad], grads[2:])
    for param, resumed_param in zip(model.parameters(), resumed_model.parameters()):
        assert torch.equal(param, resumed_param)


def _saved(state: dict) -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer


def test_grad_scaler_skips_an_overflowed_step_and_unscales_a_finite_one() -> None:
    """engine.optimizer_step unscales before stepping: MuSGD is not fused, so GradScaler checks for inf on the host
    and skips the step; a finite scaled gradient steps as the unscaled one would (the scale is a power of two)."""
    torch.manual_seed(0)
    model, reference = Tiny(), Tiny()  # noqa: F821
    reference.load_state_dict(model.state_dict())
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer(model, name="MuSGD", lr=LR, momentum=MOMENTUM, weight_decay=DECAY, num_classes=3,
                                total_steps=10).optimizer
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    scaler.scale(torch.ones(()))
    before = [p.detach().clone() for p in params]
    for param in params:
        param.grad = torch.full_like(param, float("inf"))
    scaler.unscale_(optimizer)
    scaler.step(optimizer)
    scaler.update()
    assert all(torch.equal(b, p) for b, p in zip(before, params)) and not optimizer.state
    grads = [torch.randn_like(p) for p in params]
    for param, grad in zip(params, grads):
        param.grad = grad * scaler.get_scale()
    scaler.unscale_(optimizer)
    scaler.step(optimizer)
    reference_params = [p for p in reference.parameters() if p.requires_grad]
    plain = build_optimizer(reference, name="MuSGD", lr=LR, momentum=MOMENTUM, weight_decay=DECAY, num_classes=3,
                            total_steps=10).optimizer
    _steps(plain, reference_params, [grads])
    assert all(torch.equal(p, r) for p, r in zip(params, reference_params))


def test_the_captured_cuda_graph_step_falls_back_to_eager_for_musgd(capsys: pytest.CaptureFixture) -> None:
    """MuSGD has no found_inf handling, so a captured step could not skip a non-finite one on the device: the graphs
    are off for it, said in one line under --cuda-graphs on (decided before any CUDA call: runs on a CPU too)."""
    from detector.training.engine import TrainStep

    model = Tiny()  # noqa: F821
    optimizer = build_optimizer(model, name="MuSGD", lr=LR, momentum=MOMENTUM, weight_decay=DECAY, num_classes=3,
                                total_steps=10).optimizer
    step = TrainStep(model=model, criterion=None, optimizer=optimizer, scaler=None, ema=None, precision=None,
                     schedule=_schedule(), device=torch.device("cuda"), cuda_graphs="on")
    assert step.step_graphs(list(model.parameters())) is None
    assert "cuda graphs: off, MuSGD steps eagerly" in capsys.readouterr().out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_step_matches_the_cpu_step() -> None:
    """The same step on CUDA: float32 parts to round-off, the BF16 Newton-Schulz to a few BF16 ulps of its output,
    whose entries are at most ~1.5 (singular values <= 1.5): |dp| <= lr x muon x scale (2 for ``tall``) x 1.5 x
    2**-8 x a few, bounded here by lr x muon x 2**-4."""
    torch.manual_seed(0)
    model = Tiny()  # noqa: F821
    params = [p for p in model.parameters() if p.requires_grad]
    grads = [[torch.randn_like(p) for p in params]]
    cuda_model = Tiny().cuda()  # noqa: F821
    cuda_model.load_state_dict(model.state_dict())
    cuda_params = [p for p in cuda_model.parameters() if p.requires_grad]
    for module, group_params, step_grads in ((model, params, grads), (cuda_model, cuda_params,
                                                                      [[g.cuda() for g in grads[0]]])):
        optimizer = build_optimizer(module, name="MuSGD", lr=LR, momentum=MOMENTUM, weight_decay=DECAY,
                                    num_classes=3, total_steps=10).optimizer
        _steps(optimizer, group_params, step_grads)
    for param, cuda_param in zip(params, cuda_params):
        torch.testing.assert_close(cuda_param.cpu(), param, rtol=0, atol=LR * MUON_FACTOR * 2**-4)


def test_ultralytics_optimizer_musgd_maps_in_any_case() -> None:
    from detector.aliases import optimizer

    assert optimizer("MuSGD") == optimizer("musgd") == {"optimizer": "MuSGD"}


def test_a_musgd_run_trains_and_resumes_as_the_uninterrupted_run(yolo_yaml: Path, tmp_path: Path) -> None:
    """--optimizer MuSGD end to end on the tiny dataset: finite losses, weights that moved, and a run
    stopped after epoch 1 and resumed ends with the weights of the run that was not (optimizer state in last.pt)."""
    from detector.model import build_model
    from detector.training.config import TrainConfig
    from detector.training.trainer import Trainer, train

    def config(project: Path, **overrides) -> TrainConfig:
        return TrainConfig(data=str(yolo_yaml), device="cpu", imgsz=64, epochs=2, batch=4, workers=0, cache="none",
                           project=str(project), name="run", plots=False, amp_check=False, close_mosaic=0, seed=0,
                           warmup_epochs=0.5, optimizer="MuSGD", val_interval=0, **overrides)

    full = Trainer(config(tmp_path / "a"), progress=False)
    summary = full.fit()
    assert summary["epochs_done"] == 2 and isinstance(full.step.optimizer, MuSGD)
    with open(summary["run_dir"] / "results.csv") as results:
        losses = [float(v) for row in csv.DictReader(results) for k, v in row.items() if k.strip().startswith("train/")]
    assert losses and all(math.isfinite(loss) for loss in losses)
    fresh = build_model(num_classes=full.step.model.num_classes, scale="n").state_dict()
    trained = full.step.model.state_dict()
    assert not torch.equal(trained["head.cv3.0.2.weight"], fresh["head.cv3.0.2.weight"])
    partial = train(config(tmp_path / "b"), progress=False, stop_after_epochs=1)
    resumed = Trainer(config(tmp_path / "c", resume=str(partial["run_dir"] / "weights" / "last.pt")), progress=False)
    resumed.fit()
    assert isinstance(resumed.step.optimizer, MuSGD)
    resumed_state = resumed.step.model.state_dict()
    for key, tensor in trained.items():
        if tensor.is_floating_point():  # the same steps in the same order: float32 round-off only
            torch.testing.assert_close(resumed_state[key], tensor, rtol=1e-4, atol=1e-5, msg=key)
