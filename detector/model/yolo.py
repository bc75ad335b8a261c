"""YOLOv8-, YOLO11- and YOLO26-style backbone + PAN-FPN neck + head, at the n/s/m/l/x scales.

The families share one topology (five stages down to stride 32, SPPF, a top-down then bottom-up neck, the decoupled
head) and so one forward pass. YOLO11 differs in its blocks: C3k2 for C2f, wider stage outputs, C2PSA attention after
SPPF, and a depthwise class branch in the head. YOLO26 is YOLO11 with C3k blocks throughout the neck, a residual SPPF,
attention in the last neck block, and an end-to-end head that regresses distances directly (no DFL bins).
"""

from __future__ import annotations


import torch
from torch import nn

from detector.architecture import (
    END_TO_END_FAMILIES,
    FAMILY_SCALES,
    MODEL_NAMES,
    REG_MAX,
    SCALES,
    effective,
    family_and_scale,
)
from detector.model.attention import C2PSA, C3k2Attention
from detector.model.blocks import SPPF, C2f, C3k2, Conv, concat
from detector.model.head import Detect

STRIDES = (8, 16, 32)
INPUT_MULTIPLE = max(STRIDES)  # input sides must divide by the largest stride


def image_size_problem(size: int) -> str | None:
    """Why ``--imgsz size`` cannot work (one line naming the flag), or ``None`` when it can."""
    if size < INPUT_MULTIPLE or size % INPUT_MULTIPLE:
        nearest = max(INPUT_MULTIPLE, round(size / INPUT_MULTIPLE) * INPUT_MULTIPLE)
        return f"--imgsz must be a positive multiple of {INPUT_MULTIPLE} (got {size}); try {nearest}"
    return None


class YOLO(nn.Module):
    """Anchor-free detector. ``model(images)`` returns raw head maps, one per stride (8, 16, 32).

    Args:
        num_classes: number of object classes.
        scale: the model's name (:data:`~detector.architecture.MODEL_NAMES`): ``n s m l x`` for YOLOv8, ``11n``
            ... ``11x`` for YOLO11, ``26n`` ... ``26x`` for YOLO26.
        reg_max: DFL bins per box side; ``None``: the family's (:data:`~detector.architecture.REG_MAX`: 16, or 1 for
            YOLO26, whose head regresses distances directly). Another value is refused for YOLO26.
        class_channels: the class branch's hidden width; ``None``: Ultralytics' default for the class count
            (:func:`~detector.model.head.default_class_channels`).
    """

    def __init__(self, num_classes: int = 80, scale: str = "n", reg_max: int | None = None,
                 class_channels: int | None = None) -> None:
        super().__init__()
        if scale not in MODEL_NAMES:
            raise ValueError(f"unknown model {scale!r}; choose one of {', '.join(MODEL_NAMES)}")
        family, letter = family_and_scale(scale)
        reg_max = REG_MAX[family] if reg_max is None else reg_max
        end_to_end = family in END_TO_END_FAMILIES
        if end_to_end and reg_max != REG_MAX[family]:
            raise ValueError(f"YOLO26 regresses box distances directly (reg_max {REG_MAX[family]}), not {reg_max} bins")
        self.num_classes, self.scale, self.reg_max, self.strides = num_classes, scale, reg_max, STRIDES
        self.family = family
        # Names stay positional-free; detector.weights maps Ultralytics' layer indices onto them.
        channels = self._yolov8(letter) if family == "v8" else self._yolo11(letter, yolo26=family == "26")
        self.upsample = nn.Upsample(scale_factor=2, mode="nearest")
        self.head = Detect(num_classes, channels, STRIDES, reg_max, class_channels, depthwise=family != "v8",
                           end_to_end=end_to_end)

    def _yolov8(self, letter: str) -> tuple[int, int, int]:
        """YOLOv8's layers (Ultralytics' yolov8.yaml); -> the head's input widths."""
        (d3, d6), c = _scaled(SCALES[letter], "v8")
        # Backbone
        self.stem = Conv(3, c[64], 3, 2)  # P1/2
        self.down2 = Conv(c[64], c[128], 3, 2)  # P2/4
        self.stage2 = C2f(c[128], c[128], d3, shortcut=True)
        self.down3 = Conv(c[128], c[256], 3, 2)  # P3/8
        self.stage3 = C2f(c[256], c[256], d6, shortcut=True)
        self.down4 = Conv(c[256], c[512], 3, 2)  # P4/16
        self.stage4 = C2f(c[512], c[512], d6, shortcut=True)
        self.down5 = Conv(c[512], c[1024], 3, 2)  # P5/32
        self.stage5 = C2f(c[1024], c[1024], d3, shortcut=True)
        self.sppf = SPPF(c[1024], c[1024], 5)
        self.psa = None
        # Neck: top-down (FPN) then bottom-up (PAN).
        self.top_down4 = C2f(c[1024] + c[512], c[512], d3)
        self.top_down3 = C2f(c[512] + c[256], c[256], d3)
        self.bottom_up_down3 = Conv(c[256], c[256], 3, 2)
        self.bottom_up4 = C2f(c[256] + c[512], c[512], d3)
        self.bottom_up_down4 = Conv(c[512], c[512], 3, 2)
        self.bottom_up5 = C2f(c[512] + c[1024], c[1024], d3)
        return c[256], c[512], c[1024]

    def _yolo11(self, letter: str, yolo26: bool = False) -> tuple[int, int, int]:
        """YOLO11's layers (Ultralytics' yolo11.yaml, with its parse_model's C3k blocks at m/l/x), or with ``yolo26``
        YOLO26's (yolo26.yaml: C3k blocks in every neck block, SPPF with a residual, attention in the last block);
        -> the head's input widths."""
        (n,), c = _scaled(FAMILY_SCALES["26" if yolo26 else "11"][letter], "26" if yolo26 else "11")
        deep = letter in "mlx"  # Ultralytics' parse_model turns every C3k2's C3k blocks on at these scales
        neck = deep or yolo26  # YOLO26's file asks for them in the neck at every scale
        # Backbone: the first two stages widen their input (and narrow their hidden branches to a quarter).
        self.stem = Conv(3, c[64], 3, 2)  # P1/2
        self.down2 = Conv(c[64], c[128], 3, 2)  # P2/4
        self.stage2 = C3k2(c[128], c[256], n, c3k=deep, expansion=0.25)
        self.down3 = Conv(c[256], c[256], 3, 2)  # P3/8
        self.stage3 = C3k2(c[256], c[512], n, c3k=deep, expansion=0.25)
        self.down4 = Conv(c[512], c[512], 3, 2)  # P4/16
        self.stage4 = C3k2(c[512], c[512], n, c3k=True)
        self.down5 = Conv(c[512], c[1024], 3, 2)  # P5/32
        self.stage5 = C3k2(c[1024], c[1024], n, c3k=True)
        self.sppf = SPPF(c[1024], c[1024], 5, shortcut=yolo26)
        self.psa = C2PSA(c[1024], c[1024], n)
        # Neck: top-down (FPN) then bottom-up (PAN).
        self.top_down4 = C3k2(c[1024] + c[512], c[512], n, c3k=neck)
        self.top_down3 = C3k2(c[512] + c[512], c[256], n, c3k=neck)
        self.bottom_up_down3 = Conv(c[256], c[256], 3, 2)
        self.bottom_up4 = C3k2(c[256] + c[512], c[512], n, c3k=neck)
        self.bottom_up_down4 = Conv(c[512], c[512], 3, 2)
        # YOLO26's file repeats this block once (at every depth multiplier, once).
        self.bottom_up5 = (C3k2Attention(c[512] + c[1024], c[1024], 1) if yolo26
                           else C3k2(c[512] + c[1024], c[1024], n, c3k=True))
        return c[256], c[512], c[1024]

    def rebuild_args(self) -> dict[str, int | str]:
        """What :func:`build_model` needs to build this model again (kept in checkpoints as ``model_args``). The
        class branch's width only where it is not the default: files of default models stay readable by
        versions that do not know the key."""
        args: dict[str, int | str] = {"num_classes": self.num_classes, "scale": self.scale, "reg_max": self.reg_max}
        if not self.head.default_width:
            args["class_channels"] = self.head.class_channels
        return args

    def forward(self, images: torch.Tensor) -> list[torch.Tensor]:
        """images ``[B, 3, H, W]`` in [0, 1], H and W multiples of 32 -> 3 maps ``[B, 4*reg_max+C, H/s, W/s]`` (6 in
        training an end-to-end head: :class:`~detector.model.head.Detect`)."""
        x = self.stage2(self.down2(self.stem(images)))
        p3 = self.stage3(self.down3(x))
        p4 = self.stage4(self.down4(p3))
        p5 = self.sppf(self.stage5(self.down5(p4)))
        if self.psa is not None:
            p5 = self.psa(p5)
        n4 = self.top_down4(concat((self.upsample(p5), p4), 1))
        n3 = self.top_down3(concat((self.upsample(n4), p3), 1))
        o4 = self.bottom_up4(concat((self.bottom_up_down3(n3), n4), 1))
        o5 = self.bottom_up5(concat((self.bottom_up_down4(o4), p5), 1))
        return self.head([n3, o4, o5])


def _scaled(multipliers: tuple[float, float, int], family: str) -> tuple[tuple[int, ...], dict[int, int]]:
    """The family's block repeats and each YAML channel count (64 ... 1024) as ``multipliers`` scale it: the rounding
    Ultralytics' parse_model applies, shared with the model-YAML check (:func:`~detector.architecture.effective`)."""
    repeats, channels = effective(*multipliers, family)
    return repeats, dict(zip((64, 128, 256, 512, 1024), channels))


def build_model(*, num_classes: int, scale: str = "n", reg_max: int | None = None,
                class_channels: int | None = None) -> YOLO:
    """Build a freshly initialised detector."""
    return YOLO(num_classes=num_classes, scale=scale, reg_max=reg_max, class_channels=class_channels)
