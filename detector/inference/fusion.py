"""Inference-only rewrites of the network: BatchNorm folded into the convolution before it.

The model itself never fuses (training needs the BatchNorm), so the inference backends fuse a copy.
Folding is exact in real arithmetic (``w' = w * gamma / sqrt(var + eps)``, ``b' = beta - mean * gamma /
sqrt(var + eps)``); in FP32 it rounds each weight once more, well inside the summation-order tolerance
of tests/tolerances.py. It saves one elementwise pass over every activation per ``Conv`` block.
"""

from __future__ import annotations

from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_eval

from detector.model.blocks import Conv


def fuse_conv_bn(model: nn.Module) -> nn.Module:
    """Fold every :class:`~detector.model.blocks.Conv` block's BatchNorm into its convolution, in place.

    ``model`` must be in eval mode (the running statistics are what gets folded); returns ``model``.
    """
    if model.training:
        raise ValueError("fuse_conv_bn folds running statistics: call model.eval() first")
    for block in model.modules():
        if isinstance(block, Conv) and isinstance(block.bn, nn.BatchNorm2d):
            block.conv = fuse_conv_bn_eval(block.conv, block.bn)
            block.bn = nn.Identity()
    return model
