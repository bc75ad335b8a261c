"""Model -> ONNX file: trace the :class:`ExportWrapper`, attach metadata, check, optionally slim.

Uses the TorchScript-based exporter (``dynamo=False``): it needs no ``onnxscript`` (not in the ``export``
extra) and honours the ``symbolic`` of :class:`~detector.exporting.wrapper.OnnxNMS`, which is how the
in-graph NMS becomes one standard ``NonMaxSuppression`` node. ONNX Runtime's CPU provider runs the FP16
graph too (it wraps float16 nodes that lack a CPU kernel in casts), which the tests check.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import torch

from detector.defaults import DEFAULT_OPSET
from detector.exporting.wrapper import ExportWrapper
from detector.extras import require
from detector.files import write_atomically
from detector.model import YOLO
from detector.inference.backend import read_model_info
from detector.model.metadata import INPUT_NAME, ModelInfo, encode_metadata

if TYPE_CHECKING:
    import onnx


def _onnx() -> ModuleType:
    """The ``onnx`` package, imported on first use: ``export --help`` and PyTorch inference run without it."""
    return require("onnx", "export", "ONNX export")


def dynamic_axes(info: ModelInfo) -> dict[str, dict[int, str]] | None:
    """Free dimensions per input/output name when ``info.dynamic``: batch, and height/width of the input."""
    if not info.dynamic:
        return None
    axes = {INPUT_NAME: {0: "batch", 2: "height", 3: "width"}}
    if info.nms:
        axes.update({"detections": {0: "batch"}, "num_detections": {0: "batch"}})
    else:
        axes.update({"boxes": {0: "batch", 1: "anchors"}, "scores": {0: "batch", 1: "anchors"}})
    return axes


# The lowest opsets this graph exports at, found by exporting it (torch 2.11-2.14): below 9 the exporter has no
# Upsample with a computed size; in-graph NMS needs 11 (NonMaxSuppression's batch form, and Equal on floats).
MIN_OPSET, MIN_NMS_OPSET = 9, 11


def opset_problem(opset: int, *, nms: bool) -> str | None:
    """Why ``--opset opset`` cannot export this graph with this torch, in one line; None when it can."""
    lowest = MIN_NMS_OPSET if nms else MIN_OPSET
    try:  # torch's own bound, private, so read with care: the exporter raises on a higher one anyway
        from torch.onnx._constants import ONNX_MAX_OPSET as highest
    except ImportError:
        highest = None
    if opset < lowest:
        return f"--opset {opset}: this export needs opset {lowest} or later{' with --nms' if nms else ''}"
    if highest is not None and opset > highest:
        return f"--opset {opset}: torch {torch.__version__} exports ONNX opsets up to {highest}"
    return None


def trace_to_onnx(model: YOLO, info: ModelInfo, *, opset: int, device: str) -> onnx.ModelProto:
    """The raw traced graph of the export wrapper (no metadata yet)."""
    wrapper = ExportWrapper(model, half=info.precision == "fp16", nms=info.nms, end_to_end=info.end_to_end).to(device)
    example = torch.zeros(info.batch, 3, info.imgsz, info.imgsz, device=device)
    buffer = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        # The legacy-exporter DeprecationWarning and tracer warnings about Python ints are expected here.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        # Opsets 9-10 export the neck's nearest 2x upsampling as Upsample, which torch warns may round otherwise:
        # for an integer scale it does not, and the parity check compares the outputs anyway.
        warnings.filterwarnings("ignore", "You are trying to export the model with onnx:Upsample", UserWarning)
        torch.onnx.export(
            wrapper,
            (example,),
            buffer,
            dynamo=False,
            opset_version=opset,
            input_names=[INPUT_NAME],
            output_names=info.outputs,
            dynamic_axes=dynamic_axes(info),
            do_constant_folding=True,
        )
    return _onnx().load_from_string(buffer.getvalue())


def finish_onnx(proto: onnx.ModelProto, info: ModelInfo, *, simplify: bool) -> onnx.ModelProto:
    """Optionally slim the graph, attach metadata and run the full ONNX checker (with shape inference)."""
    if simplify:
        proto = require("onnxslim", "export", "--simplify").slim(proto)
    del proto.metadata_props[:]
    onnx = _onnx()
    onnx.helper.set_model_props(proto, encode_metadata(info))
    proto.producer_name = "detector"
    onnx.checker.check_model(proto, full_check=True)
    return proto


def export_onnx(
    model: YOLO, path: str | Path, info: ModelInfo, *, opset: int = DEFAULT_OPSET, simplify: bool = False,
    device: str = "cpu",
) -> Path:
    """Export ``model`` (FP32 weights; cast inside when ``info.precision == 'fp16'``) to ``path``.

    The graph is built in memory and written atomically, so a failure leaves no half-written ``path``.
    """
    _onnx()  # before the trace: a missing package fails at once, with the line naming the extra
    if problem := opset_problem(opset, nms=info.nms is not None):
        raise ValueError(problem)
    proto = finish_onnx(trace_to_onnx(model, info, opset=opset, device=device), info, simplify=simplify)
    return write_atomically(path, proto.SerializeToString())


def read_onnx_info(path: str | Path) -> ModelInfo:
    """Metadata of an exported ONNX file (raises ``ValueError`` if it was not made by this exporter)."""
    proto = _onnx().load(str(path), load_external_data=False)
    return read_model_info({prop.key: prop.value for prop in proto.metadata_props}, source=str(path))
