"""ONNX Runtime backend for files written by :func:`detector.exporting.export_onnx`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from detector.extras import require
from detector.inference.backend import Backend, RawOutputs, run_in_fixed_batches
from detector.model.metadata import INPUT_NAME, decode_metadata
from detector.postprocess import NMSConfig


class OnnxBackend(Backend):
    """An ``onnxruntime.InferenceSession``; CUDA provider when ``device`` is CUDA and onnxruntime-gpu has it.

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
        providers = ["CPUExecutionProvider"]
        if device.startswith("cuda") and "CUDAExecutionProvider" in ort.get_available_providers():
            providers.insert(0, "CUDAExecutionProvider")
        try:
            self.session = ort.InferenceSession(str(path), options, providers=providers)
        except Exception as error:  # onnxruntime's own types (InvalidProtobuf, Fail, ...), none a bug of ours
            raise ValueError(f"{path}: not a loadable ONNX model ({_reason(error)})") from None
        info = decode_metadata(self.session.get_modelmeta().custom_metadata_map, source=str(path))
        super().__init__(info, nms)
        self.name = f"onnxruntime {info.precision}" + (" +nms" if info.nms else "")

    def infer(self, images: torch.Tensor) -> RawOutputs:
        self.check_input(images)

        def run(chunk: torch.Tensor) -> list[torch.Tensor]:
            inputs = chunk.cpu().numpy().astype(np.float32) / np.float32(255)
            return [torch.from_numpy(out) for out in self.session.run(self.info.outputs, {INPUT_NAME: inputs})]

        if self.info.dynamic:
            return tuple(run(images))
        return run_in_fixed_batches(run, images, self.info.batch)


def _reason(error: BaseException) -> str:
    """onnxruntime's message without its ``[ONNXRuntimeError] : 7 : INVALID_PROTOBUF :`` prefix, one line."""
    text = " ".join(str(error).split()) or type(error).__name__
    return text.rsplit(" : ", 1)[-1][:200]
