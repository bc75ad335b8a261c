"""ONNX Runtime's execution providers: GPU ones (TensorRT, CUDA) on a CUDA device when the build has them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from detector.exporting.parity import synthetic_images
from detector.inference.onnx_backend import choose_providers, output_shapes, with_options
from detector.model import YOLO
from detector.model.metadata import ModelInfo
from detector.postprocess import NMSConfig
from tests.tolerances import fp32_tolerance_on, rounded_relative_error

CPU_BUILD = ["AzureExecutionProvider", "CPUExecutionProvider"]
GPU_BUILD = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]


def test_cuda_device_prefers_tensorrt_then_cuda_then_cpu() -> None:
    assert choose_providers(GPU_BUILD, "cuda") == GPU_BUILD
    assert choose_providers(GPU_BUILD, "cuda:1") == GPU_BUILD
    assert choose_providers(["CUDAExecutionProvider", "CPUExecutionProvider"], "cuda") == [
        "CUDAExecutionProvider", "CPUExecutionProvider"]


def test_gpu_providers_get_the_devices_gpu_and_tensorrt_its_engine_cache(tmp_path: Path) -> None:
    cache = tmp_path / "engines"
    assert with_options(GPU_BUILD, 1, cache) == [
        ("TensorrtExecutionProvider", {"device_id": "1", "trt_engine_cache_enable": "True",
                                       "trt_engine_cache_path": str(cache)}),
        ("CUDAExecutionProvider", {"device_id": "1"}),
        "CPUExecutionProvider"]
    assert with_options(GPU_BUILD[1:], 0, cache)[0] == ("CUDAExecutionProvider", {"device_id": "0"})
    assert with_options(["CPUExecutionProvider"], 0, cache) == ["CPUExecutionProvider"]


def test_cpu_device_or_cpu_build_runs_on_the_cpu() -> None:
    assert choose_providers(GPU_BUILD, "cpu") == ["CPUExecutionProvider"]
    assert choose_providers(CPU_BUILD, "cuda") == ["CPUExecutionProvider"]


class StartedSession:
    """What ``get_provider_options`` of a started onnxruntime session returns (its values are strings)."""

    def __init__(self, options: dict[str, dict[str, str]]) -> None:
        self.options = options

    def get_provider_options(self) -> dict[str, dict[str, str]]:
        return self.options


def test_bound_tensors_go_to_the_gpu_the_session_really_runs_on() -> None:
    """Asked for GPU 1, a session whose TensorRT provider failed to start is made again by onnxruntime on CUDA
    without our options, on GPU 0: the backend binds there, not on the GPU it asked for."""
    from detector.inference.onnx_backend import session_gpu

    assert session_gpu(StartedSession({"CUDAExecutionProvider": {"device_id": "1"}}), "CUDAExecutionProvider", 1) == 1
    fell_back = StartedSession({"CUDAExecutionProvider": {"device_id": "0"}, "CPUExecutionProvider": {}})
    assert session_gpu(fell_back, "CUDAExecutionProvider", 1) == 0
    assert session_gpu(StartedSession({"CPUExecutionProvider": {}}), "CPUExecutionProvider", 0) == 0


def test_bound_output_shapes_are_the_graph_outputs(onnx_fp32: Path) -> None:
    from detector.inference import load_backend

    backend = load_backend(onnx_fp32)
    assert backend.provider == "CPUExecutionProvider" and backend.name == "onnxruntime fp32"
    boxes, scores = backend.infer(synthetic_images(64, count=2))
    assert output_shapes(backend.info, 2, 64, 64) == {"boxes": tuple(boxes.shape), "scores": tuple(scores.shape)}
    with_nms = ModelInfo(names=["a"], strides=(8, 16, 32), imgsz=64, nms=NMSConfig(max_detections=7))
    assert output_shapes(with_nms, 3, 64, 64) == {"detections": (3, 7, 6), "num_detections": (3,)}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="I/O binding runs on a GPU")
def test_io_binding_on_cuda_matches_the_cpu_provider(onnx_fp32: Path, model: YOLO) -> None:
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("this onnxruntime build has no CUDA provider (install onnxruntime-gpu)")
    from detector.inference import load_backend

    images = synthetic_images(64, count=3)
    gpu, cpu = load_backend(onnx_fp32, device="cuda"), load_backend(onnx_fp32)
    assert gpu.provider != "CPUExecutionProvider" and gpu.provider.removesuffix("ExecutionProvider") in gpu.name
    got, expected = gpu.infer(images.cuda()), cpu.infer(images)
    assert got[0].is_cuda
    # cuDNN may run FP32 convolutions in TF32 (10-bit mantissa): rounding of every layer's inputs, not order only.
    tolerance = fp32_tolerance_on(model, images, relative=rounded_relative_error(model, 2**-10))
    assert (got[0].cpu() - expected[0]).abs().max() <= tolerance.box
    assert (got[1].cpu() - expected[1]).abs().max() <= tolerance.score
