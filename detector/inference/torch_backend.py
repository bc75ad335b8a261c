"""PyTorch backend: the checkpoint's model run eagerly, FP32 or under autocast (FP16 on CUDA, BF16 on CPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from detector.checkpoint import model_from_checkpoint
from detector.data.dataset import model_input
from detector.export.metadata import ModelInfo
from detector.export.wrapper import ExportWrapper
from detector.inference.backend import Backend, RawOutputs
from detector.model import YOLO
from detector.postprocess import NMSConfig

DEFAULT_IMGSZ = 640
AUTOCAST_DTYPES = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}


class TorchBackend(Backend):
    """Runs :class:`ExportWrapper` eagerly, so its decode is the very code the ONNX graph was traced from.

    Args:
        model: detector in eval mode (FP32 weights).
        info: names and input size; PyTorch takes any size and batch, so ``info.dynamic`` is true.
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        precision: ``"fp32"``, or ``"fp16"``/``"bf16"`` autocast for the network; decode stays FP32.
    """

    def __init__(
        self, model: YOLO, info: ModelInfo, *, device: str = "cpu", precision: str = "fp32",
        nms: NMSConfig | None = None,
    ) -> None:
        if precision not in AUTOCAST_DTYPES:
            raise ValueError(f"precision must be one of {', '.join(AUTOCAST_DTYPES)}; got {precision!r}")
        super().__init__(info, nms)
        self.device = torch.device(device)
        self.precision = precision
        self.wrapper = ExportWrapper(model).to(self.device)
        self.name = f"pytorch {precision}" + ("" if precision == "fp32" else " autocast")

    @classmethod
    def from_checkpoint(cls, path: str | Path, *, imgsz: int | None = None, **kwargs: Any) -> TorchBackend:
        """EMA weights when the checkpoint has them; ``imgsz`` defaults to the training size, else 640."""
        model, checkpoint = model_from_checkpoint(path)
        config = checkpoint.get("config") or {}
        info = ModelInfo(
            names=list(checkpoint.get("names") or [str(i) for i in range(model.num_classes)]),
            strides=tuple(model.strides),
            imgsz=int(imgsz or config.get("imgsz") or DEFAULT_IMGSZ),
            dynamic=True,
        )
        return cls(model, info, **kwargs)

    @torch.inference_mode()
    def infer(self, images: torch.Tensor) -> RawOutputs:
        self.check_input(images)
        inputs = model_input(images, self.device, channels_last=False)
        dtype = AUTOCAST_DTYPES[self.precision]
        with torch.autocast(self.device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            maps = self.wrapper.model(inputs)
        return self.wrapper.decode(maps)  # FP32, outside autocast: see ExportWrapper on box precision
