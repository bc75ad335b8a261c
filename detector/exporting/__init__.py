"""Export a trained detector to ONNX (and TensorRT), check it against PyTorch, and describe it in metadata.

    from detector.exporting import ModelInfo, export_onnx
    export_onnx(model, "best.onnx", ModelInfo(names=names, strides=model.strides, imgsz=640, precision="fp16"))

See :mod:`detector.exporting.wrapper` for the graph's inputs and outputs, :mod:`detector.model.metadata`
for the stored keys and :mod:`detector.cli.export` for the command line.
"""

from __future__ import annotations

from typing import Any

from detector.exporting.wrapper import EXPORT_NMS, ExportWrapper, pack_detections
from detector.model.metadata import INPUT_NAME, ModelInfo, decode_metadata, encode_metadata

__all__ = [
    "EXPORT_NMS", "INPUT_NAME", "ExportError", "ExportWrapper", "ModelInfo", "decode_metadata", "encode_metadata",
    "export_onnx", "pack_detections", "read_onnx_info",
]


class ExportError(RuntimeError):
    """An export that could not be built (TensorRT refused the graph) or failed its parity check: one line."""


def __getattr__(name: str) -> Any:
    # Lazy: `onnx` is an optional extra, and PyTorch-only inference imports this package for ModelInfo.
    if name in ("export_onnx", "read_onnx_info"):
        from detector.exporting import onnx as onnx_export

        return getattr(onnx_export, name)
    raise AttributeError(f"module 'detector.exporting' has no attribute {name!r}")
