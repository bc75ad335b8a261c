"""Decoupled, anchor-free detection head: distribution-focal box regression (YOLOv8, YOLO11) or direct distances
with a second, one-to-one branch (YOLO26)."""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from detector.model.blocks import DFL, Conv, concat


def class_width_key(depthwise: bool) -> str:
    """The head's state-dict key whose output channels are its class branch's hidden width: the first convolution
    that sets it (YOLO11's branch opens with a depthwise one at its input's width, then a 1x1)."""
    return "cv3.0.0.1.conv.weight" if depthwise else "cv3.0.0.conv.weight"


def default_class_channels(num_classes: int, first_channels: int) -> int:
    """YOLOv8's class-branch width for a freshly built head: ``max(P3 channels, min(classes, 100))``."""
    return max(first_channels, min(num_classes, 100))


class Detect(nn.Module):
    """One box branch (``cv2``) and one class branch (``cv3``) per pyramid level.

    ``forward`` returns the raw per-level maps ``[B, 4*reg_max + num_classes, H_i, W_i]``; decoding
    lives in :mod:`detector.postprocess`, and the loss in :mod:`detector.loss`. ``reg_max`` 1 (YOLO26): each box side
    is the distance itself, in grid units, with no DFL bins.

    ``end_to_end`` (YOLO26): a second pair of branches, ``one2one_cv2`` and ``one2one_cv3``, copies of the first at
    initialisation, trained to give one box per object (one positive anchor a box), so that inference may skip NMS.
    In training ``forward`` returns both branches' maps, the usual ones first (``2 * levels`` maps); the one-to-one
    branch sees its inputs detached, so its loss trains the head alone, not the network under it (as in
    Ultralytics). In evaluation it returns one branch's: the usual one, as Ultralytics 8.4 infers by default
    (with NMS), or with :attr:`one_to_one` set, the one-to-one branch's (Ultralytics' ``nms=False``).

    ``depthwise``: YOLO11's class branch (Ultralytics' ``legacy=False``), each 3x3 convolution a depthwise 3x3 then a
    1x1; YOLOv8's is plain 3x3 convolutions. ``class_channels`` (default :func:`default_class_channels`) is the class
    branch's hidden width. A model
    fine-tuned from weights keeps the width of those weights, as Ultralytics 8.4 does, so that the branch's hidden
    layers carry over: a YOLOv8n fine-tuned from ``yolov8n.pt`` on 3 classes is 80 wide, not 64.
    """

    def __init__(self, num_classes: int, channels: tuple[int, ...], strides: tuple[int, ...], reg_max: int = 16,
                 class_channels: int | None = None, depthwise: bool = False, end_to_end: bool = False):
        super().__init__()
        self.num_classes = num_classes
        self.reg_max = reg_max
        self.strides = strides
        box_ch = max(16, channels[0] // 4, reg_max * 4)
        cls_ch = class_channels or default_class_channels(num_classes, channels[0])
        self.class_channels = cls_ch
        self.default_width = cls_ch == default_class_channels(num_classes, channels[0])
        self.cv2 = nn.ModuleList(
            nn.Sequential(Conv(c, box_ch, 3), Conv(box_ch, box_ch, 3), nn.Conv2d(box_ch, 4 * reg_max, 1))
            for c in channels
        )
        self.cv3 = nn.ModuleList(
            nn.Sequential(_depthwise_separable(c, cls_ch), _depthwise_separable(cls_ch, cls_ch),
                          nn.Conv2d(cls_ch, num_classes, 1)) if depthwise
            else nn.Sequential(Conv(c, cls_ch, 3), Conv(cls_ch, cls_ch, 3), nn.Conv2d(cls_ch, num_classes, 1))
            for c in channels
        )
        # Part of the YOLOv8 layout (and so of its state dict); used by the exportable decode path. YOLO26's head has
        # no bins to integrate (Ultralytics' nn.Identity: no state-dict key).
        self.dfl = DFL(reg_max) if reg_max > 1 else nn.Identity()
        self.init_biases(self.cv2, self.cv3)
        self.end_to_end = end_to_end
        self.one_to_one = False  # in evaluation, the one-to-one branch's maps instead of the usual ones
        if end_to_end:
            self.one2one_cv2, self.one2one_cv3 = copy.deepcopy(self.cv2), copy.deepcopy(self.cv3)

    def init_biases(self, box_branches: nn.ModuleList, class_branches: nn.ModuleList) -> None:
        """Start box logits flat (direct distances at two grid cells a side, Ultralytics' start for YOLO26) and class
        scores near a 1% prior for ~5 objects in a 640 px image."""
        for box_branch, cls_branch, stride in zip(box_branches, class_branches, self.strides):
            box_branch[-1].bias.data[:] = 1.0 if self.reg_max > 1 else 2.0
            cls_branch[-1].bias.data[:] = math.log(5 / self.num_classes / (640 / stride) ** 2)

    def forward(self, features: list[torch.Tensor]) -> list[torch.Tensor]:
        if not self.end_to_end:
            return _maps(features, self.cv2, self.cv3)
        if self.training:
            detached = [x.detach() for x in features]
            return _maps(features, self.cv2, self.cv3) + _maps(detached, self.one2one_cv2, self.one2one_cv3)
        return _maps(features, *((self.one2one_cv2, self.one2one_cv3) if self.one_to_one else (self.cv2, self.cv3)))


def _maps(features: list[torch.Tensor], box_branches: nn.ModuleList,
          class_branches: nn.ModuleList) -> list[torch.Tensor]:
    """Each level's box and class maps, concatenated: ``[B, 4*reg_max + C, H, W]``."""
    return [concat((box(x), cls(x)), 1) for x, box, cls in zip(features, box_branches, class_branches)]


def _depthwise_separable(c_in: int, c_out: int) -> nn.Sequential:
    """A depthwise 3x3 then a 1x1 convolution (Ultralytics' ``DWConv(c, c, 3)``, ``Conv(c, c_out, 1)``)."""
    return nn.Sequential(Conv(c_in, c_in, 3, groups=c_in), Conv(c_in, c_out, 1))
