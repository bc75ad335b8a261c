"""Building blocks of the YOLOv8, YOLO11 and YOLO26 families: Conv-BN-SiLU, Bottleneck, the CSP blocks (C2f;
YOLO11's C3k2 and the C3k inside it) and SPPF.

Attribute names (``conv``, ``bn``, ``cv1``, ``cv2``, ``m``) follow Ultralytics' layout on purpose, so a
pretrained YOLOv8, YOLO11 or YOLO26 state dict maps onto these modules tensor for tensor.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.autograd.function import FunctionCtx

from detector.model.recompute import batch_norm_silu


class _ConcatDenseGrad(torch.autograd.Function):
    """``torch.cat`` whose backward hands every input a dense gradient in the output gradient's layout.

    The gradient of a concatenated input is a channel slice of the output's gradient; in channels-last
    memory such a slice is not dense, and the elementwise backward kernels it feeds (SiLU, BatchNorm) drop
    off their vectorised path: SiLU backward measured 7x slower on a slice than on a dense copy (bf16,
    2-core AVX-512 CPU). One copy per slice costs far less.
    """

    @staticmethod
    def forward(ctx: FunctionCtx, dim: int, *tensors: torch.Tensor) -> torch.Tensor:
        ctx.dim, ctx.sizes = dim, [t.shape[dim] for t in tensors]
        return torch.cat(tensors, dim)

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple:
        channels_last = grad.dim() == 4 and grad.is_contiguous(memory_format=torch.channels_last)
        layout = torch.channels_last if channels_last else torch.contiguous_format
        return (None, *(g.contiguous(memory_format=layout) for g in grad.split(ctx.sizes, ctx.dim)))


def concat(tensors: list[torch.Tensor] | tuple[torch.Tensor, ...], dim: int = 1) -> torch.Tensor:
    """``torch.cat`` for the model: dense input gradients when training, the plain op otherwise (export)."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return _ConcatDenseGrad.apply(dim, *tensors)
    return torch.cat(tensors, dim)


class Conv(nn.Module):
    """Conv2d (no bias) -> BatchNorm -> SiLU, with 'same' padding for odd kernels."""

    def __init__(self, c_in: int, c_out: int, kernel: int = 1, stride: int = 1, groups: int = 1,
                 act: bool = True) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, groups=groups, bias=False)
        # YOLO's BN settings: a small eps and a slow running-stat momentum suit small, noisy batches.
        self.bn = nn.BatchNorm2d(c_out, eps=1e-3, momentum=0.03)
        # act=False: YOLO11's attention projections end linear (Ultralytics' Conv(..., act=False))
        self.act = nn.SiLU(inplace=True) if act else nn.Identity()
        # True: in training, BatchNorm's output is recomputed in backward, not kept (detector/model/recompute.py)
        self.recompute = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # type(...) is: a SyncBatchNorm (--sync-bn) subclasses BatchNorm but computes its statistics across ranks;
        # momentum None (a cumulative average) would need the counter on the host. The recomputed path applies SiLU.
        bn = self.bn
        if (self.recompute and type(bn) is nn.BatchNorm2d and bn.training and bn.momentum is not None
                and type(self.act) is nn.SiLU and torch.is_grad_enabled()):
            return batch_norm_silu(self.conv(x), bn)
        return self.act(bn(self.conv(x)))


class Bottleneck(nn.Module):
    """Two 3x3 convs with an optional residual connection; the first narrows to ``expansion`` of ``c_out``."""

    def __init__(self, c_in: int, c_out: int, shortcut: bool = True, expansion: float = 1.0) -> None:
        super().__init__()
        hidden = int(c_out * expansion)
        self.cv1 = Conv(c_in, hidden, 3)
        self.cv2 = Conv(hidden, c_out, 3)
        self.add = shortcut and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C2f(nn.Module):
    """CSP block with two convolutions and ``n`` bottlenecks whose every output is concatenated."""

    def __init__(self, c_in: int, c_out: int, n: int = 1, shortcut: bool = False, expansion: float = 0.5) -> None:
        super().__init__()
        self.c = int(c_out * expansion)  # hidden channels per branch
        self.cv1 = Conv(c_in, 2 * self.c, 1)
        self.cv2 = Conv((2 + n) * self.c, c_out, 1)
        self.m = nn.ModuleList(Bottleneck(self.c, self.c, shortcut) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv1(x)
        parts = list(y.chunk(2, 1))
        for block in self.m:
            parts.append(block(parts[-1]))
        if torch.is_grad_enabled():
            return self.cv2(concat(parts, 1))
        # Without gradients (inference, export) the two halves go in as the one tensor they are: the same values,
        # and Inductor lays a concatenation out channels-last only when one of its inputs is a whole channels-last
        # buffer. From the two halves (slices) it built the concatenation channels-first and transposed it back
        # for the next convolution: 6.7 ms of a 97 ms pt2 forward pass (nano, 640 px, 2-core AVX2 CPU).
        return self.cv2(torch.cat([y, *parts[2:]], 1))


class C3k2(C2f):
    """YOLO11's C2f: its ``n`` blocks are either bottlenecks narrowed to half their width, or (``c3k``, at the m/l/x
    scales and the deepest stages) :class:`C3k` blocks; shortcuts everywhere, as Ultralytics' C3k2 defaults."""

    def __init__(self, c_in: int, c_out: int, n: int = 1, c3k: bool = False, expansion: float = 0.5) -> None:
        super().__init__(c_in, c_out, n, shortcut=True, expansion=expansion)
        self.m = nn.ModuleList(C3k(self.c, self.c, 2) if c3k else Bottleneck(self.c, self.c, True, expansion=0.5)
                               for _ in range(n))


class C3k(nn.Module):
    """CSP block with three convolutions (Ultralytics' C3 with 3x3 bottleneck kernels): ``n`` bottlenecks on one half,
    a 1x1 convolution on the other, then both joined by a third."""

    def __init__(self, c_in: int, c_out: int, n: int = 2, shortcut: bool = True) -> None:
        super().__init__()
        hidden = c_out // 2
        self.cv1 = Conv(c_in, hidden, 1)
        self.cv2 = Conv(c_in, hidden, 1)
        self.cv3 = Conv(2 * hidden, c_out, 1)
        self.m = nn.Sequential(*(Bottleneck(hidden, hidden, shortcut) for _ in range(n)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv3(concat((self.m(self.cv1(x)), self.cv2(x)), 1))


class SPPF(nn.Module):
    """Spatial pyramid pooling (fast): ``pools`` chained 5x5 max-pools, concatenated. YOLO26's (``shortcut``) adds its
    input back and leaves the first convolution unactivated (Ultralytics' ``SPPF(c, c, 5, 3, True)``)."""

    def __init__(self, c_in: int, c_out: int, kernel: int = 5, pools: int = 3, shortcut: bool = False) -> None:
        super().__init__()
        hidden = c_in // 2
        self.cv1 = Conv(c_in, hidden, 1, act=not shortcut)
        self.cv2 = Conv(hidden * (pools + 1), c_out, 1)
        self.m = nn.MaxPool2d(kernel, 1, kernel // 2)
        self.pools = pools
        self.add = shortcut and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = [self.cv1(x)]
        for _ in range(self.pools):
            parts.append(self.m(parts[-1]))
        y = self.cv2(concat(parts, 1))
        return x + y if self.add else y


class DFL(nn.Module):
    """Distribution focal loss integral: the expectation of a softmax over ``reg_max`` bins.

    Kept as a frozen 1x1 conv (weights 0..reg_max-1) so it exports to ONNX as a plain conv and
    matches the YOLOv8 state dict layout.
    """

    def __init__(self, reg_max: int = 16) -> None:
        super().__init__()
        self.conv = nn.Conv2d(reg_max, 1, 1, bias=False).requires_grad_(False)
        self.conv.weight.data[:] = torch.arange(reg_max, dtype=torch.float).view(1, reg_max, 1, 1)
        self.reg_max = reg_max

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, 4*reg_max, A] bin logits -> [B, 4, A] distances in grid units."""
        batch, _, anchors = x.shape
        probs = x.view(batch, 4, self.reg_max, anchors).transpose(2, 1).softmax(1)
        return self.conv(probs).view(batch, 4, anchors)
