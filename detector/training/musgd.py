"""MuSGD: Muon's orthogonalised momentum update mixed with Nesterov SGD, as Ultralytics 8.4 trains with it.

Muon (Keller Jordan, MIT licence) replaces a weight matrix's momentum-smoothed gradient by the nearest
semi-orthogonal matrix (all singular values ~1), found by five steps of a quintic Newton-Schulz iteration in BF16:
every direction of the layer moves at the same rate, however lopsided the gradient's spectrum. MuSGD adds a plain
SGD step on top of it. Per parameter group (``use_muon`` marks the conv filters and linear weights)::

    muon group:  m = beta m + (1 - beta) g              (Muon's momentum, a moving average; beta = group momentum)
                 u = orthogonalise(beta m + (1 - beta) g) * sqrt(max(1, shape[-2] / shape[-1]))
                 p -= lr * muon * u                      (no weight decay in this part)
                 then the SGD step below at lr * sgd, with its own momentum buffer
    every group: d = g + weight_decay p;  b = momentum b + d;  p -= lr * (d + momentum b)   (Nesterov SGD)

The mixing factors Ultralytics passes are ``muon=0.2, sgd=1.0`` (:data:`MUON_FACTOR`, :data:`SGD_FACTOR`). The
scale uses the parameter's own last two dimensions, as Muon's reference code does: for a conv filter
``[out, in, k, k]`` that is k/k = 1, and only linear weights taller than wide are scaled up.

Matrices of one shape are orthogonalised in one batched call (a stack, no padding, so each result is the one it
would be alone); Ultralytics also pads rows to batch differing shapes, which changes only BF16 round-off.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

__all__ = ["MUON_FACTOR", "SGD_FACTOR", "MuSGD", "orthogonalise", "muon_updates"]

MUON_FACTOR = 0.2  # weight of the Muon update in a Muon group (Ultralytics 8.4's build_optimizer)
SGD_FACTOR = 1.0  # weight of the SGD update in a Muon group
NEWTON_SCHULZ = (3.4445, -4.7750, 2.0315)  # quintic coefficients: steepest slope at 0 that still converges
NEWTON_SCHULZ_STEPS = 5
NORM_EPS = 1e-7  # keeps an all-zero gradient at zero instead of 0/0


def orthogonalise(matrices: torch.Tensor) -> torch.Tensor:
    """``[batch, rows, cols]`` -> the same shape in BF16: each matrix with its singular values pushed to ~1
    (0.5-1.5; an approximation of ``U V^T`` from its SVD that trains as well and costs five BF16 steps)."""
    x = matrices.bfloat16()
    x /= x.norm(dim=(-2, -1), keepdim=True) + NORM_EPS  # top singular value <= 1: inside the iteration's basin
    tall = matrices.size(-2) > matrices.size(-1)
    if tall:  # iterate on the smaller Gram matrix
        x = x.mT
    a, b, c = NEWTON_SCHULZ
    for _ in range(NEWTON_SCHULZ_STEPS):
        gram = x @ x.mT
        polynomial = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)  # b G + c G^2
        x = torch.baddbmm(x, polynomial, x, beta=a)  # a X + (b G + c G^2) X
    return x.mT if tall else x


def muon_updates(grads: list[torch.Tensor], buffers: list[torch.Tensor], *, beta: float,
                 nesterov: bool) -> list[torch.Tensor]:
    """Muon's update for each gradient (2-D or 4-D), in its shape and dtype; ``buffers`` (momentum) change in place."""
    torch._foreach_mul_(buffers, beta)
    torch._foreach_add_(buffers, grads, alpha=1 - beta)
    if nesterov:
        smoothed = list(torch._foreach_mul(buffers, beta))
        torch._foreach_add_(smoothed, grads, alpha=1 - beta)
    else:
        smoothed = list(buffers)
    by_shape: dict[tuple[Any, ...], list[int]] = {}
    for index, update in enumerate(smoothed):
        by_shape.setdefault((update.shape, update.device, update.dtype), []).append(index)
    updates: list[torch.Tensor] = [torch.empty(0)] * len(grads)
    for (shape, _, dtype), indices in by_shape.items():
        # A conv filter [out, in, k, k] is the matrix [out, in * k * k]: one row per output channel.
        stacked = torch.stack([smoothed[i].reshape(shape[0], -1) for i in indices])
        scale = max(1.0, shape[-2] / shape[-1]) ** 0.5
        orthogonal = orthogonalise(stacked).to(dtype).mul_(scale)
        for row, index in enumerate(indices):
            updates[index] = orthogonal[row].reshape(shape)
    return updates


class MuSGD(torch.optim.Optimizer):
    """Nesterov SGD on every group, plus Muon on groups with ``use_muon`` (see the module docstring).

    Groups take ``lr``, ``momentum``, ``weight_decay``, ``nesterov`` and ``use_muon``; the schedule may change ``lr``
    and ``momentum`` between steps. State per parameter: ``momentum_buffer`` (Muon's in a Muon group, else SGD's)
    and, in a Muon group, ``momentum_buffer_SGD``, the names Ultralytics' checkpoints use.

    It steps on the host's decision only (no ``found_inf`` handling): a GradScaler checks for inf on the host
    first, and the captured CUDA-graph step leaves it out (detector/training/engine.py).
    """

    def __init__(self, params: Iterable[Any], *, lr: float = 1e-3, momentum: float = 0.0, weight_decay: float = 0.0,
                 nesterov: bool = True, use_muon: bool = False, muon: float = MUON_FACTOR,
                 sgd: float = SGD_FACTOR) -> None:
        defaults = {"lr": lr, "momentum": momentum, "weight_decay": weight_decay, "nesterov": nesterov,
                    "use_muon": use_muon}
        super().__init__(params, defaults)
        self.muon, self.sgd = muon, sgd

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                self._step_group(group, params)
        return loss

    def _step_group(self, group: dict[str, Any], params: list[torch.Tensor]) -> None:
        lr, momentum, nesterov = group["lr"], group["momentum"], group["nesterov"]
        for param in params:
            state = self.state[param]
            if not state:
                state["momentum_buffer"] = torch.zeros_like(param)
                if group["use_muon"]:
                    state["momentum_buffer_SGD"] = torch.zeros_like(param)
        grads = [p.grad for p in params]
        if group["use_muon"]:
            updates = muon_updates(grads, [self.state[p]["momentum_buffer"] for p in params], beta=momentum,
                                   nesterov=nesterov)
            torch._foreach_add_(params, updates, alpha=-lr * self.muon)
            buffers = [self.state[p]["momentum_buffer_SGD"] for p in params]
            lr = lr * self.sgd
        else:
            buffers = [self.state[p]["momentum_buffer"] for p in params]
        # Decay from the weights as the Muon part left them: the SGD part is a second step, not a share of one.
        if group["weight_decay"] != 0:
            grads = list(torch._foreach_add(grads, params, alpha=group["weight_decay"]))
        torch._foreach_mul_(buffers, momentum)
        torch._foreach_add_(buffers, grads)
        steps = torch._foreach_add(grads, buffers, alpha=momentum) if nesterov else buffers
        torch._foreach_add_(params, steps, alpha=-lr)
