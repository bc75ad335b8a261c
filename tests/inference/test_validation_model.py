"""In-training validation: an FP16 copy of the EMA model under CUDA FP16 autocast only."""

from __future__ import annotations

import torch

from detector.inference.torch_backend import validation_model
from detector.model import build_model
from detector.precision import Precision


def test_fp16_copy_on_cuda_only() -> None:
    model = build_model(num_classes=3).eval()
    for name, device_type in (("fp32", "cpu"), ("bf16", "cpu"), ("fp32", "cuda"), ("bf16", "cuda")):
        assert validation_model(model, Precision(name, device_type, "test")) is model  # training precision kept
    half = validation_model(model, Precision("fp16", "cuda", "test"))  # built on the CPU: no GPU needed to check
    assert half is not model and not half.training
    assert all(p.dtype == torch.float16 for p in half.parameters())
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the EMA itself stays FP32
