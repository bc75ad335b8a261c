"""TensorRT backend for ``.engine`` files written by :func:`detector.exporting.tensorrt.build_engine`.

UNVERIFIED: no machine this was written on has TensorRT; the calls follow the TensorRT 10 Python API
(named tensors, ``set_input_shape``, ``set_tensor_address``, ``execute_async_v3``) with torch CUDA
tensors as device buffers, so no pycuda is needed.

Engine file layout (the same as Ultralytics ``.engine`` files), written by :func:`write_engine_file` for the
exporter and read back here::

    4 bytes   little-endian uint32 N
    N bytes   UTF-8 JSON object: the metadata of detector.model.metadata (values JSON-encoded strings)
    rest      the serialized TensorRT engine (what ``trtexec --loadEngine`` would want on its own)
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

from detector.extras import Unavailable
from detector.files import write_atomically
from detector.inference.backend import Backend, RawOutputs, outputs_label, read_model_info, run_in_fixed_batches
from detector.inference.preprocess import model_input
from detector.model.metadata import HOW_TO_EXPORT, INPUT_NAME, ModelInfo, encode_metadata
from detector.postprocess import NMSConfig


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
    (length,) = struct.unpack("<I", data[:4]) if len(data) >= 4 else (len(data),)
    if len(data) < 4 or 4 + length > len(data):  # a cut or foreign file: its header runs past its end
        raise ValueError(f"{path}: not an engine file from {HOW_TO_EXPORT} ({len(data)} bytes, "
                         "shorter than the header it announces)")
    try:
        props = json.loads(data[4 : 4 + length].decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError(f"{path}: no detector metadata header; was it made by {HOW_TO_EXPORT}?") from None
    if not isinstance(props, dict):
        raise ValueError(f"{path}: its header is no metadata object; was it made by {HOW_TO_EXPORT}?")
    return read_model_info(props, source=str(path)), data[4 + length :]


class TensorRTBackend(Backend):
    """Deserialises the engine once; each call binds torch CUDA buffers and runs on the backend's own stream."""

    def __init__(self, path: str | Path, *, device: str = "cuda", nms: NMSConfig | None = None) -> None:
        info, engine_bytes = read_engine_file(path)  # first: a broken file is named as such on any machine
        reason = tensorrt_missing(f"running {Path(path).name}")
        if reason is not None:
            raise Unavailable(reason)
        import tensorrt as trt

        super().__init__(info, nms, source=str(path))
        self.device = torch.device(device)
        # TensorRT works on the current CUDA device: with --device cuda:1 the engine must be made there too.
        with torch.cuda.device(self.device):
            self.runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
            self.engine = self.runtime.deserialize_cuda_engine(engine_bytes)
            if self.engine is None:
                raise ValueError(f"{path}: TensorRT could not load the engine (built by another TensorRT version?)")
            self.context = self.engine.create_execution_context()
            # A stream of its own: on torch's default (legacy) stream TensorRT adds synchronisations to enqueueV3
            # and warns about it.
            self.stream = torch.cuda.Stream(self.device)
        self.dtypes = {
            trt.float32: torch.float32, trt.float16: torch.float16, trt.int32: torch.int32, trt.bool: torch.bool,
        }
        if hasattr(trt, "int64"):
            self.dtypes[trt.int64] = torch.int64
        self.name = f"tensorrt {info.precision}" + outputs_label(info)

    def run(self, images: torch.Tensor) -> list[torch.Tensor]:
        with torch.cuda.device(self.device):  # the engine's device (see __init__)
            return self._run(images)

    def _run(self, images: torch.Tensor) -> list[torch.Tensor]:
        inputs = model_input(images, self.device, channels_last=False)  # dense NCHW: TensorRT reads raw memory
        if not self.context.set_input_shape(INPUT_NAME, tuple(inputs.shape)):  # outside the engine's profile
            raise ValueError(f"TensorRT engine: input {list(inputs.shape)} is outside the shapes it was built for "
                             f"(batch up to {self.info.batch}, sides up to {self.info.imgsz})")
        self.context.set_tensor_address(INPUT_NAME, inputs.data_ptr())
        outputs = []
        for name in self.info.outputs:
            dtype = self.dtypes[self.engine.get_tensor_dtype(name)]
            shape = tuple(self.context.get_tensor_shape(name))
            if -1 in shape:  # a size that depends on the data: our exports pad every output to a fixed size
                raise ValueError(f"TensorRT engine output {name!r} has a data-dependent shape {list(shape)}; this "
                                 "backend takes engines exported by detector (fixed-size outputs)")
            outputs.append(torch.empty(shape, dtype=dtype, device=self.device))
            self.context.set_tensor_address(name, outputs[-1].data_ptr())
        self.stream.wait_stream(torch.cuda.current_stream(self.device))  # the input's upload and the outputs' memory
        if not self.context.execute_async_v3(self.stream.cuda_stream):
            raise RuntimeError("TensorRT execution failed")
        self.stream.synchronize()  # before the caller (or the allocator) touches the outputs or the input
        return outputs

    def infer(self, images: torch.Tensor) -> RawOutputs:
        self.check_input(images)
        if self.info.dynamic:
            if images.shape[0] > self.info.batch:  # the optimisation profile stops at the exported batch
                return run_in_fixed_batches(self.run, images, self.info.batch)
            return tuple(self.run(images))
        return run_in_fixed_batches(self.run, images, self.info.batch)
