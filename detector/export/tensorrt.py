"""ONNX file -> TensorRT engine, with the export metadata in a JSON header.

UNVERIFIED: TensorRT cannot be installed on the machines this code was written on, so nothing below
has been run; it follows the documented TensorRT 8.6/10 Python API. Where ``tensorrt`` or a CUDA GPU
is missing, :func:`tensorrt_missing` says so and the CLI stops before writing anything.

Engine file layout (the same as Ultralytics ``.engine`` files)::

    4 bytes   little-endian uint32 N
    N bytes   UTF-8 JSON object: the metadata of detector.export.metadata (values JSON-encoded strings)
    rest      the serialized TensorRT engine (what ``trtexec --loadEngine`` would want on its own)
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

from detector.export.metadata import INPUT_NAME, ModelInfo, decode_metadata, encode_metadata
from detector.files import write_atomically

DEFAULT_WORKSPACE_GIB = 4.0


def tensorrt_missing(task: str = "TensorRT export") -> str | None:
    """``None`` when TensorRT can run here, else a one-line reason starting with ``task``."""
    missing = []
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        missing.append("the 'tensorrt' Python package")
    if not torch.cuda.is_available():
        missing.append("a CUDA GPU")
    if not missing:
        return None
    return f"{task} needs {' and '.join(missing)}, which this machine lacks"


def write_engine_file(path: str | Path, info: ModelInfo, engine: bytes) -> Path:
    """Header (length + metadata JSON) then the engine bytes, written atomically."""
    header = json.dumps(encode_metadata(info)).encode()
    return write_atomically(path, struct.pack("<I", len(header)) + header + engine)


def read_engine_file(path: str | Path) -> tuple[ModelInfo, bytes]:
    """-> (metadata, serialized engine) from a file written by :func:`write_engine_file`."""
    data = Path(path).read_bytes()
    (length,) = struct.unpack("<I", data[:4])
    try:
        props = json.loads(data[4 : 4 + length].decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError(f"{path}: no detector metadata header; was it made by export.py?") from None
    return decode_metadata(props, source=str(path)), data[4 + length :]


def build_engine(
    onnx_path: str | Path, engine_path: str | Path, info: ModelInfo, *, workspace_gib: float = DEFAULT_WORKSPACE_GIB
) -> Path:
    """Parse ``onnx_path`` and build a serialized engine (FP16 kernels allowed when ``info.precision == 'fp16'``).

    Dynamic exports get one optimisation profile: batch 1..``info.batch`` and sides ``stride``..``imgsz``
    (optimised for ``batch x imgsz``). Raises ``RuntimeError`` with the parser's messages on failure.
    """
    import tensorrt as trt  # optional, GPU-only dependency

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    # TensorRT 10 networks are always explicit-batch and the flag is deprecated; 8.x needs it set.
    explicit = getattr(trt.NetworkDefinitionCreationFlag, "EXPLICIT_BATCH", None)
    network = builder.create_network(0 if explicit is None else 1 << int(explicit))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(index)) for index in range(parser.num_errors))
        raise RuntimeError(f"{onnx_path}: TensorRT could not parse the ONNX graph: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_gib * (1 << 30)))
    if info.precision == "fp16":
        config.set_flag(trt.BuilderFlag.FP16)
    if info.dynamic:
        profile = builder.create_optimization_profile()
        full = (info.batch, 3, info.imgsz, info.imgsz)
        profile.set_shape(INPUT_NAME, (1, 3, info.stride, info.stride), full, full)
        config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise RuntimeError(f"{onnx_path}: TensorRT failed to build an engine (see the log above)")
    return write_engine_file(engine_path, info, bytes(serialized))
