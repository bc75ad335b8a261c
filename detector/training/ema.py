"""Exponential moving average of model weights, with the YOLOX warm-up ramp."""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from detector.distributed import unwrap


class ModelEMA:
    """Keeps ``ema = d * ema + (1 - d) * model`` with ``d = decay * (1 - exp(-updates / tau))``.

    The ramp makes early updates follow the fast-changing model closely; later the average smooths.
    Buffers (BN statistics) are averaged too.
    """

    def __init__(self, model: nn.Module, decay: float = 0.9999, tau: float = 2000.0, updates: int = 0) -> None:
        self.module = copy.deepcopy(unwrap(model)).eval().requires_grad_(False)
        self.decay, self.tau, self.updates = decay, tau, updates
        # The floating-point tensors, in state_dict order: one fused update over all of them per step.
        self._targets = [v for v in self.module.state_dict().values() if v.dtype.is_floating_point]

    def current_decay(self) -> float:
        return self.decay * (1 - math.exp(-self.updates / self.tau))

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """One EMA step towards ``model``'s weights and float buffers.

        One ``_foreach_lerp_`` over every tensor instead of a kernel per tensor (~350 in the nano model):
        on a GPU that is a few launches instead of hundreds each step, and no host synchronisation.
        """
        self.updates += 1
        sources = [v.detach() for v in unwrap(model).state_dict().values() if v.dtype.is_floating_point]
        torch._foreach_lerp_(self._targets, sources, 1 - self.current_decay())

