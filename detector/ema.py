"""Exponential moving average of model weights, with the YOLOX warm-up ramp."""

from __future__ import annotations

import copy
import math

import torch
from torch import nn


class ModelEMA:
    """Keeps ``ema = d * ema + (1 - d) * model`` with ``d = decay * (1 - exp(-updates / tau))``.

    The ramp makes early updates follow the fast-changing model closely; later the average smooths.
    Buffers (BN statistics) are averaged too.
    """

    def __init__(self, model: nn.Module, decay: float = 0.9999, tau: float = 2000.0, updates: int = 0) -> None:
        self.module = copy.deepcopy(unwrap(model)).eval().requires_grad_(False)
        self.decay, self.tau, self.updates = decay, tau, updates

    def current_decay(self) -> float:
        return self.decay * (1 - math.exp(-self.updates / self.tau))

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        self.updates += 1
        decay = self.current_decay()
        source = unwrap(model).state_dict()
        for name, value in self.module.state_dict().items():
            if value.dtype.is_floating_point:
                value.lerp_(source[name].detach(), 1 - decay)


def unwrap(model: nn.Module) -> nn.Module:
    """The bare model inside DistributedDataParallel (or the model itself)."""
    return model.module if hasattr(model, "module") and isinstance(model, nn.parallel.DistributedDataParallel) else model
