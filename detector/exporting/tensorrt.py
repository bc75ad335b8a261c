"""ONNX file -> TensorRT engine, with the export metadata in a JSON header.

UNVERIFIED: TensorRT cannot be installed on the machines this code was written on, so nothing below
has been run; it follows the documented TensorRT 8.6, 10 and 11 Python API. Where ``tensorrt`` or a CUDA GPU
is missing, :func:`~detector.inference.tensorrt_backend.tensorrt_missing` says so and the CLI stops before
writing anything. The engine file format (a metadata header, then the engine) is read and written by
:mod:`detector.inference.tensorrt_backend`, beside the backend that loads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from detector.defaults import DEFAULT_WORKSPACE_GIB
from detector.exporting import ExportError
from detector.inference.tensorrt_backend import write_engine_file
from detector.model.metadata import INPUT_NAME, ModelInfo


def build_engine(
    onnx_path: str | Path, engine_path: str | Path, info: ModelInfo, *, workspace_gib: float = DEFAULT_WORKSPACE_GIB,
    device: str = "cuda",
) -> Path:
    """Parse ``onnx_path`` (the ONNX export at ``info.precision``) and build a serialized engine in its precisions.

    Dynamic exports get one optimisation profile: batch 1..``info.batch`` and sides ``stride``..``imgsz``
    (optimised for ``batch x imgsz``). Raises :class:`~detector.exporting.ExportError` with the parser's messages
    on failure.
    """
    import tensorrt as trt  # optional, GPU-only dependency
    import torch

    # TensorRT builds (and times its tactics) on the current CUDA device: --device cuda:1 builds there, for the
    # GPU that will run the engine (the backend loads it under the same context). An engine is CUDA's whatever
    # --device says, as the backend runs it.
    target = torch.device(device) if torch.device(device).type == "cuda" else torch.device("cuda")
    with torch.cuda.device(target):
        return _build(trt, onnx_path, engine_path, info, workspace_gib)


def network_flags(trt: Any) -> tuple[int, bool]:
    """``create_network``'s flags, and whether the network is strongly typed (each layer runs in the precision of
    the ONNX graph's own tensors).

    Strongly typed from TensorRT 10 on: an FP16 engine is built from the FP16 ONNX export (FP16 convolutions, the
    box decode and any NMS in FP32, as its parity check measured), not from the FP32 graph under
    ``BuilderFlag.FP16``, which let TensorRT pick FP16 for any layer (box areas of ~4e5 overflow FP16's 65,504) and
    which TensorRT 11 removed along with weak typing (there the flag is accepted and ignored). TensorRT 8.x has no
    strong typing: explicit batch, and ``BuilderFlag.FP16`` for an FP16 engine.
    """
    creation = trt.NetworkDefinitionCreationFlag
    if (strong := getattr(creation, "STRONGLY_TYPED", None)) is not None:
        return 1 << int(strong), True
    return 1 << int(creation.EXPLICIT_BATCH), False


def _build(trt: Any, onnx_path: str | Path, engine_path: str | Path, info: ModelInfo, workspace_gib: float) -> Path:
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags, strongly_typed = network_flags(trt)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(index)) for index in range(parser.num_errors))
        raise ExportError(f"{onnx_path}: TensorRT could not parse the ONNX graph: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_gib * (1 << 30)))
    if info.precision == "fp16" and not strongly_typed:  # 8.x: the FP16 graph's types are hints; allow its kernels
        config.set_flag(trt.BuilderFlag.FP16)
    if info.dynamic:
        profile = builder.create_optimization_profile()
        full = (info.batch, 3, info.imgsz, info.imgsz)
        profile.set_shape(INPUT_NAME, (1, 3, info.stride, info.stride), full, full)
        config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise ExportError(f"{onnx_path}: TensorRT failed to build an engine (see the log above)")
    return write_engine_file(engine_path, info, bytes(serialized))
