"""TensorRT: the engine header round-trips here; building and running need TensorRT and a GPU (skipped here)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from detector.model.metadata import ModelInfo
from detector.exporting.tensorrt import build_engine
from detector.inference.tensorrt_backend import read_engine_file, write_engine_file
from detector.model import YOLO
from detector.postprocess import NMSConfig
from tests.tolerances import fp32_tolerance_on, rounded_relative_error

IMGSZ = 64  # conftest fixtures use 64 px images
NAMES = ["circle", "square", "triangle"]


def test_engine_header_round_trips(tmp_path: Path) -> None:
    info = ModelInfo(names=NAMES, strides=(8, 16, 32), imgsz=IMGSZ, precision="fp16", nms=NMSConfig(max_detections=7))
    path = write_engine_file(tmp_path / "m.engine", info, b"\x00engine-bytes")
    assert read_engine_file(path) == (info, b"\x00engine-bytes")


def test_engine_matches_pytorch(model: YOLO, images: torch.Tensor, tmp_path: Path) -> None:
    pytest.importorskip("tensorrt")
    if not torch.cuda.is_available():
        pytest.skip("TensorRT needs a CUDA GPU")
    pytest.importorskip("onnx", reason="the engine is built from an ONNX export")
    from detector.exporting import ExportWrapper, export_onnx
    from detector.inference.tensorrt_backend import TensorRTBackend

    info = ModelInfo(names=NAMES, strides=(8, 16, 32), imgsz=IMGSZ, batch=4)
    engine = build_engine(export_onnx(model, tmp_path / "m.onnx", info), tmp_path / "m.engine", info)
    boxes, scores = TensorRTBackend(engine).infer(images)
    with torch.no_grad():
        ref_boxes, ref_scores = ExportWrapper(model)(images.float() / 255)
    # TensorRT may run convolutions in TF32 (10-bit mantissa): depth * 2^-10 relative, as for FP16 storage.
    tf32_eps = 2.0**-10
    tolerance = fp32_tolerance_on(model, images, relative=rounded_relative_error(model, tf32_eps))
    torch.testing.assert_close(boxes.cpu(), ref_boxes, rtol=0, atol=tolerance.box)
    torch.testing.assert_close(scores.cpu(), ref_scores, rtol=0, atol=tolerance.score)


class FakeTensorRT:
    """The builder API ``_build`` calls, as TensorRT 11 (strong typing only: no ``BuilderFlag.FP16``, the
    STRONGLY_TYPED creation flag kept and ignored) or 8.x (no strong typing, explicit batch to ask for) has it.
    It records what was asked of it; nothing is built (TensorRT cannot be installed here)."""

    class Logger:
        WARNING = 2

        def __init__(self, severity: int) -> None:
            pass

    class MemoryPoolType:
        WORKSPACE = 0

    def __init__(self, version: int) -> None:
        self.flags_asked: list[int] = []
        self.builder_flags: list[object] = []
        fake = self
        if version >= 10:
            self.NetworkDefinitionCreationFlag = type("Creation", (), {"STRONGLY_TYPED": 1})
        else:
            self.NetworkDefinitionCreationFlag = type("Creation", (), {"EXPLICIT_BATCH": 0})
            self.BuilderFlag = type("BuilderFlag", (), {"FP16": "fp16"})

        class Config:
            def set_memory_pool_limit(self, pool: int, size: int) -> None:
                pass

            def set_flag(self, flag: object) -> None:
                fake.builder_flags.append(flag)

        class Builder:
            def __init__(self, logger: object) -> None:
                pass

            def create_network(self, flags: int) -> object:
                fake.flags_asked.append(flags)
                return object()

            def create_builder_config(self) -> Config:
                return Config()

            def build_serialized_network(self, network: object, config: Config) -> bytes:
                return b"serialized"

        class OnnxParser:
            def __init__(self, network: object, logger: object) -> None:
                pass

            def parse_from_file(self, path: str) -> bool:
                return True

        self.Builder, self.OnnxParser = Builder, OnnxParser


@pytest.mark.parametrize("version", [11, 8])
def test_an_fp16_engine_takes_the_fp16_graphs_types_where_tensorrt_has_strong_typing(version: int,
                                                                                     tmp_path: Path) -> None:
    """TensorRT 10 and 11: a strongly typed network and no precision flag (11 removed BuilderFlag.FP16: asking for
    it raised AttributeError); 8.x: explicit batch and BuilderFlag.FP16."""
    from detector.exporting.tensorrt import _build

    trt = FakeTensorRT(version)
    info = ModelInfo(names=NAMES, strides=(8, 16, 32), imgsz=IMGSZ, precision="fp16")
    engine = _build(trt, tmp_path / "m.onnx", tmp_path / "m.engine", info, 1.0)
    assert read_engine_file(engine) == (info, b"serialized")
    assert trt.flags_asked == ([1 << 1] if version >= 10 else [1 << 0])
    assert trt.builder_flags == ([] if version >= 10 else ["fp16"])
