"""The exportable module: model + box decode (+ optional NMS) with named inputs and outputs.

Box decoding is :func:`detector.postprocess.decode_outputs`, the very function behind training mAP, ``val``
and the PyTorch backend, so the export parity check exercises the decoder the numbers come from. Output
contract:

* without NMS: ``boxes [B, A, 4]`` xyxy in input pixels and ``scores [B, A, C]`` sigmoid class scores,
  both FP32, anchors in level order (stride 8, 16, 32) exactly as :func:`detector.postprocess.decode_outputs`;
* with NMS: ``detections [B, K, 6]`` rows ``(x1, y1, x2, y2, score, label)`` sorted by score, K =
  ``max_detections``; rows past ``num_detections [B]`` (int64) are padding (all zeros).

``end_to_end`` (YOLO26, ``export --end-to-end``): the outputs are the one-to-one branch's, and "with NMS" is the
NMS-free top-k instead (:func:`pack_top_k`, the same outputs).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from detector.architecture import display_name
from detector.defaults import EXPORT_CONF, EXPORT_IOU, EXPORT_MAX_DET
from detector.model import YOLO
from detector.nms import nms_kernel
from detector.postprocess import NMSConfig, decode_outputs

EXPORT_NMS = NMSConfig(conf_threshold=EXPORT_CONF, iou_threshold=EXPORT_IOU, max_detections=EXPORT_MAX_DET)


class OnnxNMS(torch.autograd.Function):
    """ONNX ``NonMaxSuppression`` (per batch, per class); eagerly the same thing via torchvision's NMS kernel.

    boxes ``[B, A, 4]`` xyxy, scores ``[B, C, A]`` -> selected ``[N, 3]`` int64 (batch, class, anchor).
    Keeps boxes with score strictly above ``conf_threshold``, as ONNX Runtime and TensorRT do.
    """

    @staticmethod
    def forward(
        ctx: Any, boxes: torch.Tensor, scores: torch.Tensor, max_per_class: int, iou_threshold: float,
        conf_threshold: float,
    ) -> torch.Tensor:
        selected = []
        for batch_index in range(scores.shape[0]):
            for class_index in range(scores.shape[1]):
                class_scores = scores[batch_index, class_index]
                candidates = (class_scores > conf_threshold).nonzero().flatten()
                keep = candidates[nms_kernel()(boxes[batch_index, candidates], class_scores[candidates], iou_threshold)]
                keep = keep[:max_per_class]
                columns = (torch.full_like(keep, batch_index), torch.full_like(keep, class_index), keep)
                selected.append(torch.stack(columns, 1))
        return torch.cat(selected) if selected else torch.zeros((0, 3), dtype=torch.int64, device=boxes.device)

    @staticmethod
    def symbolic(
        graph: Any, boxes: Any, scores: Any, max_per_class: int, iou_threshold: float, conf_threshold: float
    ) -> Any:
        """Graph and values are TorchScript internals (``torch._C.Graph`` / ``Value``)."""

        def constant(value: float, dtype: torch.dtype) -> Any:
            return graph.op("Constant", value_t=torch.tensor([value], dtype=dtype))

        return graph.op(
            "NonMaxSuppression",
            boxes,
            scores,
            constant(max_per_class, torch.int64),
            constant(iou_threshold, torch.float32),
            constant(conf_threshold, torch.float32),
        )


def pack_detections(boxes: torch.Tensor, scores: torch.Tensor, config: NMSConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Class-aware NMS with a fixed-size result, written with ops that export to ONNX.

    boxes ``[B, A, 4]`` and scores ``[B, A, C]`` (FP32) -> ``detections [B, K, 6]``, ``num_detections [B]``.
    Same rule as :func:`detector.postprocess.non_max_suppression` minus its ``max_candidates`` cap:
    with ``multi_label`` every (box, class) pair above threshold is a candidate, otherwise only each
    box's best class.
    """
    batch, anchors, classes = scores.shape
    if not config.multi_label:  # zero every class score but the best one of each box
        scores = scores * (scores == scores.amax(-1, keepdim=True))
    per_class = scores.transpose(1, 2).contiguous()  # [B, C, A], the layout NonMaxSuppression wants
    selected = OnnxNMS.apply(boxes, per_class, config.max_detections, config.iou_threshold, config.conf_threshold)
    batch_index, class_index, anchor_index = selected.unbind(1)
    # Scatter the survivors' scores into a dense [B, C*A] grid, then take the top K per image: a fixed
    # output shape without a loop over images. K zero columns guarantee top-k has K entries to pick.
    flat_index = (batch_index * classes + class_index) * anchors + anchor_index
    flat_scores = per_class.flatten()
    kept = torch.zeros_like(flat_scores).scatter(0, flat_index, flat_scores.gather(0, flat_index))
    kept = torch.cat((kept.view(batch, classes * anchors), kept.new_zeros(batch, config.max_detections)), 1)
    top_scores, top_index = kept.topk(config.max_detections, 1)
    valid = top_scores > 0
    # Clamped as floats (exact below 2**24 classes): ONNX's Clip takes integers only from opset 12.
    labels = torch.div(top_index, anchors, rounding_mode="floor").to(boxes.dtype).clamp(max=classes - 1)
    top_boxes = boxes.gather(1, (top_index % anchors).unsqueeze(-1).expand(-1, -1, 4))
    detections = torch.cat((top_boxes, top_scores.unsqueeze(-1), labels.unsqueeze(-1)), -1)
    return detections * valid.unsqueeze(-1).to(boxes.dtype), valid.sum(1)


def pack_top_k(boxes: torch.Tensor, scores: torch.Tensor, config: NMSConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The NMS-free top-k of :mod:`detector.topk` with a fixed-size result, in ops that export to ONNX (``TopK``):
    boxes ``[B, A, 4]`` and scores ``[B, A, C]`` (FP32) -> ``detections [B, K, 6]``, ``num_detections [B]``: each
    image's best K = ``max_detections`` (box, class) pairs above ``conf_threshold`` (at most A of them, as
    :mod:`detector.topk`), best first, equal scores by pair index (ONNX's TopK promises the lower index first).
    Not ``agnostic`` (export has no such flag), and boxes are not checked for finite coordinates (nor does the
    in-graph NMS check them)."""
    batch, anchors, classes = scores.shape
    keep = config.max_detections
    # K zero columns (and K zero boxes) guarantee top-k has K entries to pick whatever the input size: a padding
    # pair's index p < A x C + K points at a box row p // C < A + K, and its score 0 is never above conf.
    flat = torch.cat((scores.flatten(1), scores.new_zeros(batch, keep)), 1)
    top_scores, top_index = flat.topk(keep, 1)
    # Computed from the tensor, not the traced shape: a dynamic export's anchor count is the input's.
    anchor_count = torch.ones_like(scores[:, :, 0]).sum(1, keepdim=True)
    rank = torch.arange(keep, device=scores.device, dtype=scores.dtype).unsqueeze(0)
    valid = (top_scores > config.conf_threshold) & (rank < anchor_count)
    anchor = torch.div(top_index, classes, rounding_mode="floor")
    labels = (top_index - anchor * classes).to(boxes.dtype)  # exact as floats below 2**24 classes
    padded_boxes = torch.cat((boxes, boxes.new_zeros(batch, keep, 4)), 1)
    top_boxes = padded_boxes.gather(1, anchor.unsqueeze(-1).expand(-1, -1, 4))
    detections = torch.cat((top_boxes, top_scores.unsqueeze(-1), labels.unsqueeze(-1)), -1)
    return detections * valid.unsqueeze(-1).to(boxes.dtype), valid.sum(1)


class ExportWrapper(nn.Module):
    """``images [B, 3, H, W]`` float in [0, 1] RGB (H, W multiples of 32) -> decoded boxes and scores.

    Args:
        model: the trained detector; deep-copied so the caller's module is untouched.
        half: run backbone, neck and head convolutions in FP16; inputs, outputs, the DFL expectation,
            box arithmetic and NMS stay FP32. Why: FP16 has a 0.25-0.5 px step at 256-1024 px, which
            would quantise box corners, and FP32 I/O lets callers feed the same tensors to every export.
        nms: append in-graph NMS with this config (see module docstring for the output layout); with
            ``nms.end_to_end``, the NMS-free top-k (:func:`pack_top_k`) instead.
        compute_dtype: the network's dtype, overriding ``half`` (BF16 for the pt2 export on CPUs with it).
        end_to_end: trace the head's one-to-one branch (YOLO26 only), whose boxes need no NMS.
    """

    def __init__(
        self, model: YOLO, *, half: bool = False, nms: NMSConfig | None = None,
        compute_dtype: torch.dtype | None = None, end_to_end: bool = False,
    ) -> None:
        super().__init__()
        if (nms is not None and nms.end_to_end) and not end_to_end:
            raise ValueError("the NMS-free top-k goes with the one-to-one branch: ExportWrapper(end_to_end=True)")
        self.model = copy.deepcopy(model).eval()
        if end_to_end and not self.model.head.end_to_end:
            raise ValueError(f"end_to_end: only YOLO26 has a one-to-one head; this is {display_name(model.scale)}")
        self.model.head.one_to_one = end_to_end
        self.compute_dtype = compute_dtype or (torch.float16 if half else torch.float32)
        self.model.to(self.compute_dtype)
        self.strides = tuple(model.strides)
        self.reg_max = model.reg_max
        self.nms = nms
        if nms is not None:
            # Load the NMS kernel now, not at its first call inside the trace: where that first call imports
            # torchvision, its import-time CUDA version check runs an operator the tracer cannot record
            # ("unsupported output type: int, from operator: torchvision::_cuda_version").
            nms_kernel()
        self.eval()  # torch.onnx.export restores the wrapper's mode afterwards; train mode would flip BN

    @property
    def output_names(self) -> list[str]:
        return ["detections", "num_detections"] if self.nms else ["boxes", "scores"]

    def decode(self, maps: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Raw maps ``[B, 4*reg_max+C, H/s, W/s]`` -> boxes ``[B, A, 4]`` px xyxy, scores ``[B, A, C]`` (FP32)."""
        decoded = decode_outputs(maps, self.strides, self.reg_max)
        return decoded[..., :4], decoded[..., 4:]

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        boxes, scores = self.decode(self.model(images.to(self.compute_dtype)))
        if self.nms is None:
            return boxes, scores
        return (pack_top_k if self.nms.end_to_end else pack_detections)(boxes, scores, self.nms)
