"""PyTorch inference: training's evaluation (:func:`make_torch_infer`, the live model under autocast) and the
prepared copy behind :class:`TorchBackend` (``val --half``, predict, benchmark, the export parity reference),
both ending in the FP32 decode of :func:`detector.postprocess.decode_outputs` (the decode the exports carry).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from detector.defaults import DEFAULT_IMGSZ
from detector.distributed import unwrap
from detector.inference.augmented import augmented
from detector.architecture import display_name
from detector.inference.backend import Backend, RawOutputs, end_to_end_refusal
from detector.inference.cuda_graph import CudaGraphRunner
from detector.inference.fusion import fuse_conv_bn
from detector.inference.preprocess import Detections, model_input
from detector.inference.pt_model import model_from_pt
from detector.model import YOLO
from detector.model.metadata import ModelInfo
from detector.postprocess import NMSConfig, decode_outputs, non_max_suppression
from detector.precision import Precision, has_native_bf16

PRECISIONS = ("fp32", "fp16", "bf16")


def decode_images_with_maps(
    model: YOLO, images: torch.Tensor, *, precision: Precision, device: torch.device, channels_last: bool = False
) -> tuple[torch.Tensor, ...]:
    """uint8 ``[B, 3, S, S]`` letterboxed images -> ``[B, A, 4 + C]`` FP32 (xyxy input pixels, class scores), then
    the head's raw maps it decoded (one per level, in the network's dtype): training's validation computes its loss
    from them (detector/metrics/val_loss.py) without a second forward. A flat tuple of tensors, which a
    :class:`CudaGraphRunner` replays as it is.

    The network runs under ``precision``'s autocast; the decode runs outside it, in FP32, so box corners are
    not rounded to FP16's 0.25-0.5 px step. On CUDA under autocast the input is made in autocast's dtype (the
    same values its cast would give: :func:`~detector.inference.preprocess.model_input`); on the CPU in FP32.
    """
    maps = head_maps(model, images, precision=precision, device=device, channels_last=channels_last)
    return decode_outputs(maps, model.strides, model.reg_max), *maps


def head_maps(
    model: YOLO, images: torch.Tensor, *, precision: Precision, device: torch.device, channels_last: bool = False
) -> list[torch.Tensor]:
    """The network's raw per-level maps of uint8 ``images``, under ``precision``'s autocast (see
    :func:`decode_images_with_maps`)."""
    dtype = precision.dtype if device.type == "cuda" and precision.dtype is not None else torch.float32
    with precision.autocast():
        return model(model_input(images, device, channels_last=channels_last, dtype=dtype))


def make_torch_infer(
    model: nn.Module, *, precision: Precision, nms: NMSConfig, device: torch.device, channels_last: bool = False,
    with_maps: bool = False, augment: bool = False,
) -> Callable[[torch.Tensor], Detections | tuple[Detections, list[torch.Tensor]]]:
    """``infer(images uint8 [B,3,S,S]) -> detections`` for :func:`detector.metrics.loop.run_validation`;
    ``with_maps``: ``-> (detections, the head's raw maps)``, for a pass that computes the loss too; ``augment``:
    test-time augmentation (:mod:`detector.inference.augmented`; no maps then).

    Runs ``model`` itself (unwrapped from DDP, not copied): training's validator hands it the EMA's folded copy
    (detector/training/validator.py), the benchmarks a model. ``nms.end_to_end`` (the NMS-free top-k) needs the
    model in its one-to-one branch (:func:`use_one_to_one`), and that branch needs it.
    """
    if with_maps and augment:
        raise ValueError("the head's maps of an augmented pass are three views' own: ask for one or the other")
    bare = unwrap(model)
    # The one-to-one branch's boxes are one an object (no NMS); the usual branch's need NMS.
    if nms.end_to_end != bool(getattr(getattr(bare, "head", None), "one_to_one", False)):
        raise ValueError("nms.end_to_end goes with the head's one-to-one branch: use_one_to_one(model, source=...)")

    def decode(images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return decode_images_with_maps(bare, images, precision=precision, device=device, channels_last=channels_last)

    @torch.no_grad()
    def infer(images: torch.Tensor) -> Detections | tuple[Detections, list[torch.Tensor]]:
        if augment:  # the views made where the model runs
            decoded, maps = augmented(lambda view: decode(view)[0], images.to(device), bare.strides), []
        else:
            decoded, *maps = decode(images)
        detections = non_max_suppression(decoded, nms)
        return (detections, maps) if with_maps else detections

    return infer


def use_one_to_one(model: YOLO, *, source: str | Path) -> YOLO:
    """``model`` (itself, changed) evaluating its one-to-one branch, for the NMS-free top-k (``--end-to-end``);
    ``ValueError`` in one line naming ``source`` for a model without one (YOLOv8, YOLO11)."""
    if not model.head.end_to_end:
        raise ValueError(end_to_end_refusal(str(source), f"this is a {display_name(model.scale)} model"))
    model.head.one_to_one = True
    return model


class TorchBackend(Backend):
    """The checkpoint's model prepared for inference, behind the :class:`Backend` interface.

    A copy of the model with BatchNorm folded into the convolutions (:func:`fuse_conv_bn`) and its weights
    converted to ``precision`` once (no autocast: autocast casts every weight again on every call), run
    channels-last: NHWC is what cuDNN's FP16 tensor-core kernels read, and on the CPU oneDNN's NHWC kernels ran
    the nano model at 640 px 15-18% faster than NCHW at batch 1 and 8, 1.5x at batch 32 (2-core AVX2 EPYC;
    docs/inference.md). On CUDA the forward + box decode is replayed from a CUDA graph, one per batch size and
    input shape, captured on first use (:class:`CudaGraphRunner`). The decode is FP32 either way.

    Args:
        model: detector (FP32 weights); copied, so the caller's module is untouched.
        info: names and input size; PyTorch takes any size and batch, so ``info.dynamic`` is true.
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        precision: ``"fp32"``, ``"fp16"`` or ``"bf16"`` weights and activations (see :func:`half_precision`).
        nms: as :class:`Backend`'s; with ``end_to_end`` (or ``info.end_to_end``), the copy runs its one-to-one
            branch (YOLO26; any other model is refused in one line naming ``source``) and the NMS-free top-k.
    """

    def __init__(
        self, model: YOLO, info: ModelInfo, *, device: str = "cpu", precision: str = "fp32",
        nms: NMSConfig | None = None, source: str | Path = "the model",
    ) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}; got {precision!r}")
        copied = copy.deepcopy(model).float().eval()
        copied.head.one_to_one = False  # the usual branch unless asked for, whatever the caller's model was left in
        if info.end_to_end or (nms is not None and nms.end_to_end):
            use_one_to_one(copied, source=source)
            info = dataclasses.replace(info, end_to_end=True)
        super().__init__(info, nms, source=str(source))
        self.device = torch.device(device)
        self.precision = Precision(precision, self.device.type, "asked for")
        self.dtype = self.precision.dtype or torch.float32
        fused = fuse_conv_bn(copied)
        self.model = fused.to(self.device, self.dtype, memory_format=torch.channels_last)
        self.forward: Callable[[torch.Tensor], torch.Tensor] = self.decode
        if self.device.type == "cuda":
            self.forward = CudaGraphRunner(self.decode)  # a graph per input shape: square inputs keep them few
        self.shapes_are_free = self.device.type != "cuda"

    @property
    def name(self) -> str:  # type: ignore[override]  # what ran: a failed capture leaves the forward eager
        branch = " end-to-end" if self.info.end_to_end else ""  # the one-to-one head, no NMS
        if not isinstance(self.forward, CudaGraphRunner):
            return f"pytorch {self.precision.name}{branch}"
        return f"pytorch {self.precision.name}{branch} " + ("cuda graph" if self.forward.failed is None else "eager")

    def decode(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 ``[B, 3, S, S]`` on the device -> ``[B, A, 4 + C]`` FP32 decoded boxes and scores.

        Scaling to [0, 1] happens here, so on CUDA it is part of the graph and only uint8 crosses the bus.
        """
        inputs = images.float().div_(255).to(self.dtype)
        return decode_outputs(self.model(inputs), self.model.strides, self.model.reg_max)

    @classmethod
    def from_checkpoint(cls, path: str | Path, *, imgsz: int | None = None, **kwargs: Any) -> TorchBackend:
        """EMA weights when the checkpoint has them; ``imgsz`` defaults to the training size, else 640."""
        model, checkpoint = model_from_pt(path)  # ours, or Ultralytics weights through the safe reader
        return cls.from_model(model, checkpoint, imgsz=imgsz, source=str(path), **kwargs)

    @classmethod
    def from_model(cls, model: YOLO, checkpoint: dict[str, Any], *, imgsz: int | None = None,
                   **kwargs: Any) -> TorchBackend:
        """:meth:`from_checkpoint` for a model already read (:func:`model_from_pt`) with its checkpoint dict."""
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
        decoded = self.forward(images.to(self.device, non_blocking=True).contiguous(memory_format=torch.channels_last))
        return decoded[..., :4], decoded[..., 4:]


def half_precision(device: str | torch.device) -> str:
    """What ``--half`` runs the PyTorch backend in: FP16 on CUDA, BF16 on a CPU with native BF16, else FP32
    (emulated BF16 and FP16 convolutions are slower than FP32 on a CPU)."""
    kind = torch.device(device).type
    if kind == "cuda":
        return "fp16"
    return "bf16" if has_native_bf16(kind) else "fp32"
