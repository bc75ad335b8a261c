"""YOLO11's attention at the smallest scale: C2PSA, its PSA blocks and their multi-head self-attention; and YOLO26's
C3k2 whose blocks end in a PSA block.

Built as Ultralytics' ``C2PSA`` / ``PSABlock`` / ``Attention`` compute them, with their attribute names (``cv1``,
``m``, ``attn.qkv``, ``ffn``) so that a YOLO11 state dict maps onto them tensor for tensor. The attention runs over
every position of the stride-32 map (400 at 640 px), once per image: a small share of the model's work.
"""

from __future__ import annotations

import torch
from torch import nn

from detector.model.blocks import Bottleneck, C3k2, Conv, concat


class Attention(nn.Module):
    """Multi-head self-attention over a feature map's positions, with a depthwise 3x3 convolution of the values
    added as positional encoding. Keys and queries are ``attn_ratio`` as wide as a head."""

    def __init__(self, dim: int, num_heads: int = 8, attn_ratio: float = 0.5) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.key_dim = int(self.head_dim * attn_ratio)
        self.scale = self.key_dim ** -0.5
        self.qkv = Conv(dim, dim + 2 * self.key_dim * num_heads, 1, act=False)
        self.proj = Conv(dim, dim, 1, act=False)
        self.pe = Conv(dim, dim, 3, groups=dim, act=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, channels, height, width = x.shape
        # reshape, not view: in channels-last memory (training on CUDA, the CPU's inference) the map's positions are
        # not the innermost dimension, and a view would fail where a copy does not.
        qkv = self.qkv(x).reshape(batch, self.num_heads, 2 * self.key_dim + self.head_dim, height * width)
        q, k, v = qkv.split((self.key_dim, self.key_dim, self.head_dim), dim=2)
        weights = ((q * self.scale).transpose(-2, -1) @ k).softmax(dim=-1)
        attended = (v @ weights.transpose(-2, -1)).reshape(batch, channels, height, width)
        return self.proj(attended + self.pe(v.reshape(batch, channels, height, width)))


class PSABlock(nn.Module):
    """Attention, then a two-layer 1x1 feed-forward network, each with a residual connection."""

    def __init__(self, channels: int, attn_ratio: float = 0.5, num_heads: int = 4) -> None:
        super().__init__()
        self.attn = Attention(channels, num_heads=num_heads, attn_ratio=attn_ratio)
        self.ffn = nn.Sequential(Conv(channels, channels * 2, 1), Conv(channels * 2, channels, 1, act=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x)
        return x + self.ffn(x)


class C2PSA(nn.Module):
    """CSP block whose one half passes ``n`` :class:`PSABlock` s (one head per 64 channels) and the other goes
    straight to the closing 1x1 convolution."""

    def __init__(self, c_in: int, c_out: int, n: int = 1, expansion: float = 0.5) -> None:
        super().__init__()
        if c_in != c_out:
            raise ValueError(f"C2PSA keeps its width: {c_in} channels in, {c_out} out")
        self.c = int(c_in * expansion)
        self.cv1 = Conv(c_in, 2 * self.c, 1)
        self.cv2 = Conv(2 * self.c, c_in, 1)
        self.m = nn.Sequential(*(PSABlock(self.c, attn_ratio=0.5, num_heads=max(self.c // 64, 1)) for _ in range(n)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.cv1(x).split((self.c, self.c), dim=1)
        return self.cv2(concat((a, self.m(b)), 1))


class C3k2Attention(C3k2):
    """YOLO26's last neck block (Ultralytics' ``C3k2(..., attn=True)``): a C3k2 whose ``n`` blocks are each a
    bottleneck narrowed to half its width, then a :class:`PSABlock` (one head per 64 channels)."""

    def __init__(self, c_in: int, c_out: int, n: int = 1, expansion: float = 0.5) -> None:
        super().__init__(c_in, c_out, n, expansion=expansion)
        self.m = nn.ModuleList(
            nn.Sequential(Bottleneck(self.c, self.c, True, expansion=0.5),
                          PSABlock(self.c, attn_ratio=0.5, num_heads=max(self.c // 64, 1)))
            for _ in range(n))
