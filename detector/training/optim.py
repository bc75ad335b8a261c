"""Optimizer construction: parameter groups, and what ``--optimizer auto`` picks (the schedule: detector/training/schedule.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

# Every optimizer Ultralytics takes by name, as torch builds them: the Adam family with beta1 from --momentum,
# RMSprop and SGD with it as momentum (Nesterov for SGD), as Ultralytics sets them; MuSGD is ours (musgd.py).
from detector.choices import ADAM_FAMILY
from detector.choices import OPTIMIZER as OPTIMIZERS
from detector.training.musgd import MUON_FACTOR, SGD_FACTOR, MuSGD

CLASS_BRANCH_LR_SCALE = 3.0  # MuSGD's lr on the class branches (head.cv3, head.one2one_cv3), as Ultralytics


NORMS = (nn.BatchNorm2d, nn.SyncBatchNorm, nn.GroupNorm, nn.LayerNorm)  # their weights are not decayed


@dataclass(frozen=True)
class OptimizerChoice:
    """The optimizer and the values the schedule must use with it (``auto`` may have changed them)."""

    optimizer: torch.optim.Optimizer
    name: str  # one of OPTIMIZERS but auto
    lr: float
    momentum: float  # SGD/RMSprop momentum or the Adam family's beta1: the value warm-up ramps towards
    warmup_bias_lr: float


def build_optimizer(
    model: nn.Module,
    *,
    name: str,
    lr: float,
    momentum: float,
    weight_decay: float,
    num_classes: int,
    total_steps: int,
    warmup_bias_lr: float = 0.1,
) -> OptimizerChoice:
    """Three parameter groups: conv/linear weights (decayed), norm weights and biases (not decayed).

    ``auto`` picks AdamW with a class-count-scaled learning rate for short runs (<= 10k steps), where it
    converges faster, and SGD otherwise (as Ultralytics up to 8.3). Ultralytics 8.4 takes MuSGD there; it is built
    here (``--optimizer MuSGD``, :func:`musgd_groups`) but auto does not pick it: changing the default of every long
    run needs an accuracy comparison on real long runs, which has not been made.
    It changes only the optimizer and its learning rate: beta1 warms up to ``momentum`` and biases warm down from
    ``warmup_bias_lr`` as with an explicit choice. Ultralytics
    instead sets beta1 0.9 and a bias warm-up from 0 for its auto AdamW; measured on BCCD (320 px, 40 epochs,
    docs/training.md "Optimizer and warm-up") that lost 0.07 mAP50-95 (0.469 against 0.536 at a fixed size,
    seed 0), most of it from the bias warm-up (0.513 with the bias start of 0.1 alone).
    """
    name, lr = resolve_optimizer(name, lr, num_classes=num_classes, total_steps=total_steps)
    if name == "MuSGD":
        optimizer = MuSGD(musgd_groups(model, lr=lr, momentum=momentum, weight_decay=weight_decay), lr=lr,
                          momentum=momentum, muon=MUON_FACTOR, sgd=SGD_FACTOR)
        return OptimizerChoice(optimizer, name, lr, momentum, warmup_bias_lr)
    decay, no_decay, biases = [], [], []
    for module in model.modules():
        for param_name, param in module.named_parameters(recurse=False):
            if not param.requires_grad:
                continue
            if param_name == "bias":
                biases.append(param)
            elif isinstance(module, NORMS):
                no_decay.append(param)
            else:
                decay.append(param)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
        {"params": biases, "weight_decay": 0.0},
    ]
    # Fused kernels where the device supports them: fewer passes over the parameters per step.
    fused = {"fused": True} if _fused_supported(model) else {}
    if name in ("AdamW", "Adam"):
        optimizer = getattr(torch.optim, name)(groups, lr=lr, betas=(momentum, 0.999), **fused)
    elif name in ADAM_FAMILY:  # no fused kernels in torch for these
        optimizer = getattr(torch.optim, name)(groups, lr=lr, betas=(momentum, 0.999))
    elif name == "RMSprop":
        optimizer = torch.optim.RMSprop(groups, lr=lr, momentum=momentum)
    elif name == "SGD":
        optimizer = torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=True, **fused)
        zero_momentum_buffers(optimizer)
    else:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")
    for group in optimizer.param_groups:
        group["initial_lr"] = lr
    return OptimizerChoice(optimizer, name, lr, momentum, warmup_bias_lr)


def zero_momentum_buffers(optimizer: torch.optim.Optimizer) -> None:
    """Give a fused SGD a zero momentum buffer for each parameter that has none (any other optimizer: untouched).

    Under a GradScaler a fused optimizer is stepped even when the gradients overflowed, with ``found_inf`` set, and
    its kernel then leaves everything as it was. But torch's fused SGD makes its momentum buffers on its first step
    with ``empty_like``, just before that kernel: a run whose first step overflows (FP16 on CUDA, where the scale
    starts at 2**16 and the first steps often do) kept uninitialised memory as momentum, and the next step moved
    the weights by whatever it held (1e23 to 1e32 in tests). A zero buffer gives the first step a created one gives
    (momentum x 0 + gradient, dampening 0), so nothing else changes. A resumed run needs nothing: its saved state
    has every buffer, made by the steps before it was saved.
    """
    if not isinstance(optimizer, torch.optim.SGD) or not optimizer.defaults.get("fused"):
        return
    for group in optimizer.param_groups:
        if group["momentum"] == 0:
            continue
        for param in group["params"]:
            if optimizer.state[param].get("momentum_buffer") is None:
                optimizer.state[param]["momentum_buffer"] = torch.zeros_like(param)


def musgd_groups(model: nn.Module, *, lr: float, momentum: float, weight_decay: float) -> list[dict]:
    """MuSGD's parameter groups, as Ultralytics 8.4 builds them: every trainable 2-D or 4-D weight (conv filters,
    linear weights) in the Muon group (decayed), then biases and norm weights (not decayed) and any other weight
    (decayed) with plain SGD; each split into the class branches' parameters at 3x ``lr`` and the rest (empty
    groups left out). Each group names its ``param_group`` (weight, bn, bias, muon) and its ``lr_scale``, which
    the schedule reads (detector/training/engine.py set_learning_rates) so the 3x holds through warm-up and decay.
    """
    head = getattr(model, "head", None)
    branches = [getattr(head, name, None) for name in ("cv3", "one2one_cv3")]
    boosted = {id(param) for branch in branches if branch is not None for param in branch.parameters()}
    roles: dict[str, list[torch.Tensor]] = {"weight": [], "bn": [], "bias": [], "muon": []}
    for module in model.modules():
        for param_name, param in module.named_parameters(recurse=False):
            if not param.requires_grad:
                continue
            if param.ndim in (2, 4):  # before the bias test, as there: Muon takes any matrix
                roles["muon"].append(param)
            elif param_name == "bias":
                roles["bias"].append(param)
            elif isinstance(module, NORMS):
                roles["bn"].append(param)
            else:
                roles["weight"].append(param)
    groups = []
    for role, params in roles.items():
        for scale in (CLASS_BRANCH_LR_SCALE, 1.0):
            chosen = [p for p in params if (id(p) in boosted) == (scale != 1.0)]
            if chosen:
                groups.append({"params": chosen, "lr": lr * scale, "initial_lr": lr * scale, "lr_scale": scale,
                               "momentum": momentum, "nesterov": True, "use_muon": role == "muon",
                               "weight_decay": weight_decay if role in ("weight", "muon") else 0.0,
                               "param_group": role})
    return groups


AUTO_ADAMW_MAX_STEPS = 10_000  # optimizer steps, this many included: Ultralytics' `iterations > 10000` leaves AdamW


def resolve_optimizer(name: str, lr: float, *, num_classes: int, total_steps: int) -> tuple[str, float]:
    """``(optimizer, lr)`` for ``--optimizer name``: ``auto`` becomes AdamW with a class-count-scaled learning
    rate for runs of at most ``AUTO_ADAMW_MAX_STEPS`` optimizer steps, else SGD; an explicit name is kept.

    ``total_steps`` must be the run's planned length: under ``--time`` the fitted one, not the configured.
    """
    if name != "auto":
        return name, lr
    if total_steps <= AUTO_ADAMW_MAX_STEPS:
        return "AdamW", round(0.002 * 5 / (4 + num_classes), 6)
    return "SGD", lr


def _fused_supported(model: nn.Module) -> bool:
    device = next(model.parameters()).device
    return device.type in ("cuda", "cpu") and all(p.dtype == torch.float32 for p in model.parameters())
