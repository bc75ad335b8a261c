"""ONNX Runtime backend for files written by :func:`detector.exporting.export_onnx`.

On ``--device cuda`` with an ``onnxruntime-gpu`` build it asks for the TensorRT and CUDA execution providers
(whichever the build has, TensorRT first) and binds torch CUDA tensors as inputs and outputs (I/O binding),
so images and results stay on the GPU; elsewhere it runs the CPU provider on numpy arrays, as before.
The provider that actually runs (ONNX Runtime falls back when one fails to start) is in ``provider`` and
in the backend's name.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from detector.extras import require
from detector.inference.backend import Backend, RawOutputs, outputs_label, read_model_info, run_in_fixed_batches
from detector.inference.preprocess import model_input
from detector.model.metadata import INPUT_NAME, ModelInfo
from detector.paths import data_home
from detector.postprocess import NMSConfig

GPU_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider")  # preferred first
CPU_PROVIDER = "CPUExecutionProvider"
TENSORRT_CACHE = Path("cache") / "onnxruntime-tensorrt"  # in the data folder: engines TensorRT built, per shape
TORCH_DTYPES = {"boxes": torch.float32, "scores": torch.float32, "detections": torch.float32,
                "num_detections": torch.int64}


def choose_providers(available: Sequence[str], device: str) -> list[str]:
    """Execution providers to ask for, best first: on a CUDA ``device`` the GPU ones ``available`` has, then CPU."""
    chosen = [name for name in GPU_PROVIDERS if name in available] if device.startswith("cuda") else []
    return chosen + [CPU_PROVIDER]


def with_options(providers: Sequence[str], gpu: int, engine_cache: Path) -> list[str | tuple[str, dict[str, str]]]:
    """``providers`` as ``InferenceSession`` takes them, the GPU ones with their options (onnxruntime's documented
    names): GPU index ``gpu`` (without the option both run on GPU 0) and, for TensorRT, its engine cache in
    ``engine_cache``: TensorRT builds an engine per input shape on first use, which takes minutes, and the cache
    keeps it for the next process."""
    index = str(gpu)  # onnxruntime reads provider options as strings
    settings: list[str | tuple[str, dict[str, str]]] = []
    for name in providers:
        if name == "TensorrtExecutionProvider":
            settings.append((name, {"device_id": index, "trt_engine_cache_enable": "True",
                                    "trt_engine_cache_path": str(engine_cache)}))
        elif name == "CUDAExecutionProvider":
            settings.append((name, {"device_id": index}))
        else:
            settings.append(name)
    return settings


def output_shapes(info: ModelInfo, batch: int, height: int, width: int) -> dict[str, tuple[int, ...]]:
    """The shape of each graph output for a ``[batch, 3, height, width]`` input (to pre-allocate bound outputs)."""
    if info.nms:
        return {"detections": (batch, info.nms.max_detections, 6), "num_detections": (batch,)}
    anchors = sum((height // stride) * (width // stride) for stride in info.strides)
    return {"boxes": (batch, anchors, 4), "scores": (batch, anchors, len(info.names))}


class OnnxBackend(Backend):
    """An ``onnxruntime.InferenceSession`` on the providers of :func:`choose_providers`.

    Inputs go in as float32 ``[B, 3, S, S]`` in [0, 1] (the graph casts to FP16 inside when exported with
    ``--half``); fixed-batch graphs are fed in chunks of their batch size.
    """

    def __init__(
        self, path: str | Path, *, device: str = "cpu", nms: NMSConfig | None = None, threads: int = 0
    ) -> None:
        ort = require("onnxruntime", "export", f"running {Path(path).name}")  # optional: the export extra

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads  # 0 = onnxruntime's default (one per core)
        # Idle worker threads would otherwise busy-wait after each run and starve our letterbox and NMS,
        # which run on the same cores between calls.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3  # errors only: the FP16 graph on CPU logs a warning per inserted cast
        providers = choose_providers(ort.get_available_providers(), device)
        # The GPU the session runs on and the tensors bound to it are allocated on: the index --device names,
        # else the current device (where torch puts a tensor for "cuda").
        gpu = 0
        if providers[0] != CPU_PROVIDER:
            gpu = torch.device(device).index if torch.device(device).index is not None else torch.cuda.current_device()
        engine_cache = data_home() / TENSORRT_CACHE
        if "TensorrtExecutionProvider" in providers:
            engine_cache.mkdir(parents=True, exist_ok=True)
        try:
            self.session = ort.InferenceSession(str(path), options,
                                                providers=with_options(providers, gpu, engine_cache))
        except Exception as error:  # onnxruntime's own types (InvalidProtobuf, Fail, ...), none a bug of ours
            raise ValueError(f"{path}: not a loadable ONNX model ({_reason(error)})") from None
        info = read_model_info(self.session.get_modelmeta().custom_metadata_map, source=str(path))
        super().__init__(info, nms, source=str(path))
        self.provider = self.session.get_providers()[0]  # the first in priority: with TensorRT, what it cannot
        # build runs on the next provider (CUDA), so the name says which one leads, not that it ran every node
        self.gpu = session_gpu(self.session, self.provider, gpu)
        self.device = torch.device("cuda", self.gpu) if self.provider != CPU_PROVIDER else torch.device("cpu")
        where = f" (GPU {self.gpu})" if self.provider != CPU_PROVIDER else ""
        print(f"onnxruntime: {Path(path).name} runs on {self.provider}{where}", file=sys.stderr)
        label = "" if self.provider == CPU_PROVIDER else f" {self.provider.removesuffix('ExecutionProvider')}"
        self.name = f"onnxruntime {info.precision}{label}" + outputs_label(info)

    def run_on_cpu(self, chunk: torch.Tensor) -> list[torch.Tensor]:
        inputs = chunk.cpu().numpy().astype(np.float32) / np.float32(255)
        return [torch.from_numpy(out) for out in self.session.run(self.info.outputs, {INPUT_NAME: inputs})]

    def run_bound(self, chunk: torch.Tensor) -> list[torch.Tensor]:
        """GPU providers: bind torch CUDA tensors as the input and the (pre-allocated) outputs; no host copy."""
        inputs = model_input(chunk, self.device, channels_last=False)  # dense NCHW float32: ORT reads raw memory
        binding = self.session.io_binding()
        binding.bind_input(INPUT_NAME, "cuda", self.gpu, np.float32, list(inputs.shape), inputs.data_ptr())
        outputs = []
        for name, shape in output_shapes(self.info, *inputs.shape[:1], *inputs.shape[2:]).items():
            outputs.append(torch.empty(shape, dtype=TORCH_DTYPES[name], device=self.device))
            numpy_dtype = np.float32 if outputs[-1].dtype == torch.float32 else np.int64
            binding.bind_output(name, "cuda", self.gpu, numpy_dtype, list(shape), outputs[-1].data_ptr())
        torch.cuda.current_stream(self.device).synchronize()  # the input is ready before ORT's stream reads it
        # ORT's CUDA provider makes its GPU this thread's current device (cudaSetDevice) and leaves it so: after a
        # run on cuda:1 torch's plain "cuda" would mean GPU 1 for the rest of the process.
        with torch.cuda.device(self.device):
            self.session.run_with_iobinding(binding)
        return outputs

    def infer(self, images: torch.Tensor) -> RawOutputs:
        self.check_input(images)
        run = self.run_on_cpu if self.provider == CPU_PROVIDER else self.run_bound
        if self.info.dynamic:
            return tuple(run(images))
        return run_in_fixed_batches(run, images, self.info.batch)


def session_gpu(session: Any, provider: str, asked: int) -> int:
    """The GPU ``session`` runs ``provider`` on. Asked for ``asked``, but a GPU session that fails to start (its
    TensorRT provider, say) is made again by onnxruntime on CUDA and the CPU without our provider options: on GPU 0,
    where the tensors bound to it must be too."""
    device_id = session.get_provider_options().get(provider, {}).get("device_id")
    return asked if device_id is None else int(device_id)


def _reason(error: BaseException) -> str:
    """onnxruntime's message without its ``[ONNXRuntimeError] : 7 : INVALID_PROTOBUF :`` prefix, one line."""
    text = " ".join(str(error).split()) or type(error).__name__
    return text.rsplit(" : ", 1)[-1][:200]
