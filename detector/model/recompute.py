"""BatchNorm and SiLU that keep only BatchNorm's input for the backward pass: the activation between them is recomputed.

A Conv block (convolution -> BatchNorm -> SiLU) keeps three tensors of its output's size for the backward pass: the
convolution's output (BatchNorm's input), BatchNorm's output (SiLU's input) and SiLU's output (the next layer's
input). :class:`BatchNormSiLU` keeps the first, BatchNorm's batch statistics (a few numbers a channel) and, through
the next layer, the third; its backward pass recomputes BatchNorm's output from the kept input with the same kernel,
so it is the same tensor bit for bit, and the gradients are those of ``silu(batch_norm(x))`` exactly
(tests/model/test_recompute.py). The cost is that recomputation: one more read of the input for the statistics and one
for the normalisation, and one write, in each block it is used for.

Where: the blocks at strides 2 and 4 (:data:`RECOMPUTED`), whose outputs are the model's largest (YOLOv8n, batch 64,
704 px, FP16: the stem's 254 MB, and ~0.5 GB more in the next two), in training on CUDA (``--recompute``), where
issue 33 asks peak GPU memory within 1.1x Ultralytics'. The CPU keeps the plain path: memory is rarely the limit
there, and its steps are bound by arithmetic that the recomputation would add to.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from detector.choices import RECOMPUTE as CHOICES

# The YOLO model's blocks at strides 2 and 4: their activations are the largest (a quarter of the pixels at stride 2,
# a sixteenth at 4, against 1/64 and less from stride 8 on) for the least work to recompute.
RECOMPUTED = ("stem", "down2", "stage2")


class BatchNormSiLU(torch.autograd.Function):
    """``silu(batch_norm(x))`` in training mode, updating the running statistics once, keeping ``x`` for backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, running_mean: torch.Tensor | None,
                running_var: torch.Tensor | None, momentum: float, eps: float) -> torch.Tensor:
        normalized, mean, invstd = torch.native_batch_norm(x, weight, bias, running_mean, running_var, True, momentum,
                                                           eps)
        ctx.save_for_backward(x, weight, bias, mean, invstd)
        ctx.eps = eps
        return torch.nn.functional.silu(normalized)

    @staticmethod
    @once_differentiable  # a second derivative would need silu_backward's, which PyTorch does not define
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, bias, mean, invstd = ctx.saved_tensors
        # The forward's kernel on the same input, without the running statistics: the same output, bit for bit.
        normalized = torch.native_batch_norm(x, weight, bias, None, None, True, 0.0, ctx.eps)[0]
        grad_normalized = torch.ops.aten.silu_backward(grad, normalized)
        del normalized
        wanted = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]]
        grad_x, grad_weight, grad_bias = torch.ops.aten.native_batch_norm_backward(
            grad_normalized, x, weight, None, None, mean, invstd, True, ctx.eps, wanted)
        return grad_x, grad_weight, grad_bias, None, None, None, None


def batch_norm_silu(x: torch.Tensor, bn: nn.BatchNorm2d) -> torch.Tensor:
    """``silu(bn(x))`` for ``bn`` in training mode, through :class:`BatchNormSiLU`; its counter moves as it would."""
    if x.numel() <= x.shape[1]:  # as BatchNorm itself refuses: one value a channel has no variance (running_var: inf)
        raise ValueError(f"Expected more than 1 value per channel when training, got input size {list(x.shape)}")
    if bn.num_batches_tracked is not None:
        bn.num_batches_tracked.add_(1)
    return BatchNormSiLU.apply(x, bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.momentum, bn.eps)


def recompute_wanted(choice: str, device: torch.device) -> bool:
    """``--recompute``: auto is on for CUDA only."""
    if choice not in CHOICES:
        raise ValueError(f"--recompute must be one of {', '.join(CHOICES)} (got {choice!r})")
    return choice == "on" or (choice == "auto" and device.type == "cuda")


def recompute_activations(model: nn.Module, enabled: bool) -> list[str]:
    """Turn the recomputation on or off in the :data:`RECOMPUTED` blocks of ``model`` (each of their Conv blocks);
    returns the names of the blocks it is on in."""
    found = []
    for name in RECOMPUTED:
        block = getattr(model, name, None)
        if block is None:
            continue
        found.append(name)
        for module in block.modules():
            if hasattr(module, "recompute"):  # a Conv block (detector/model/blocks.py imports this module)
                module.recompute = enabled
    return found if enabled else []
