"""The precision choice and the one fallback ladder, including GPUs that only emulate BF16."""

import pytest
import torch

from detector import precision as precision_module
from detector.precision import Precision, fallback_chain, resolve_precision, safer_precision, safest


@pytest.fixture
def gpu_emulating_bf16(monkeypatch):
    """A pre-Ampere GPU (T4, V100): torch says BF16 is supported only when emulation counts."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)


def test_emulated_bf16_is_never_chosen_on_a_gpu(gpu_emulating_bf16):
    cuda = torch.device("cuda", 0)
    assert not precision_module.gpu_has_native_bf16()
    assert resolve_precision("bf16", cuda).name == "fp32"
    assert resolve_precision("auto", cuda).name == "fp16"
    assert safer_precision("fp16", "cuda") == "fp32"
    assert [p.name for p in fallback_chain(Precision("fp16", "cuda", "test"))] == ["fp16", "fp32"]


def test_native_bf16_gpu_falls_back_through_bf16(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert [p.name for p in fallback_chain(Precision("fp16", "cuda", "test"))] == ["fp16", "bf16", "fp32"]


def test_cpu_ladder_follows_the_hardware():
    native = precision_module.cpu_has_native_bf16()
    assert safer_precision("fp16", "cpu") == ("bf16" if native else "fp32")
    assert safer_precision("bf16", "cpu") == "fp32" and safer_precision("fp32", "cpu") is None


def test_safest_takes_the_lower_rung():
    bf16, fp32 = Precision("bf16", "cpu", "a"), Precision("fp32", "cpu", "b")
    assert safest(bf16, fp32) is fp32 and safest(fp32, bf16) is fp32 and safest(bf16, bf16) is bf16
