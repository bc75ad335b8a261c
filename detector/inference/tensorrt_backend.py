"""TensorRT backend for ``.engine`` files written by :func:`detector.export.tensorrt.build_engine`.

UNVERIFIED: no machine this was written on has TensorRT; the calls follow the TensorRT 10 Python API
(named tensors, ``set_input_shape``, ``set_tensor_address``, ``execute_async_v3``) with torch CUDA
tensors as device buffers, so no pycuda is needed.
"""

from __future__ import annotations

from pathlib import Path

import torch

from detector.data.dataset import model_input
from detector.export.metadata import INPUT_NAME
from detector.export.tensorrt import read_engine_file, tensorrt_missing
from detector.inference.backend import Backend, RawOutputs, run_in_fixed_batches
from detector.postprocess import NMSConfig


class TensorRTBackend(Backend):
    """Deserialises the engine once; each call binds torch CUDA buffers and runs on the current stream."""

    def __init__(self, path: str | Path, *, device: str = "cuda", nms: NMSConfig | None = None) -> None:
        reason = tensorrt_missing(f"running {Path(path).name}")
        if reason is not None:
            raise RuntimeError(reason)
        import tensorrt as trt

        info, engine_bytes = read_engine_file(path)
        super().__init__(info, nms)
        self.device = torch.device(device)
        self.runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self.engine = self.runtime.deserialize_cuda_engine(engine_bytes)
        if self.engine is None:
            raise RuntimeError(f"{path}: TensorRT could not load the engine (built by another TensorRT version?)")
        self.context = self.engine.create_execution_context()
        self.dtypes = {
            trt.float32: torch.float32, trt.float16: torch.float16, trt.int32: torch.int32, trt.bool: torch.bool,
        }
        if hasattr(trt, "int64"):
            self.dtypes[trt.int64] = torch.int64
        self.name = f"tensorrt {info.precision}" + (" +nms" if info.nms else "")

    def run(self, images: torch.Tensor) -> list[torch.Tensor]:
        inputs = model_input(images, self.device, channels_last=False)  # dense NCHW: TensorRT reads raw memory
        self.context.set_input_shape(INPUT_NAME, tuple(inputs.shape))
        self.context.set_tensor_address(INPUT_NAME, inputs.data_ptr())
        outputs = []
        for name in self.info.outputs:
            dtype = self.dtypes[self.engine.get_tensor_dtype(name)]
            outputs.append(torch.empty(tuple(self.context.get_tensor_shape(name)), dtype=dtype, device=self.device))
            self.context.set_tensor_address(name, outputs[-1].data_ptr())
        stream = torch.cuda.current_stream(self.device)
        if not self.context.execute_async_v3(stream.cuda_stream):
            raise RuntimeError("TensorRT execution failed")
        stream.synchronize()
        return outputs

    def infer(self, images: torch.Tensor) -> RawOutputs:
        self.check_input(images)
        if self.info.dynamic:
            if images.shape[0] > self.info.batch:  # the optimisation profile stops at the exported batch
                return run_in_fixed_batches(self.run, images, self.info.batch)
            return tuple(self.run(images))
        return run_in_fixed_batches(self.run, images, self.info.batch)
