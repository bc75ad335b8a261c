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


@pytest.mark.parametrize("variable", ["ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"])
def test_an_instruction_set_cap_below_bf16_means_no_native_bf16(monkeypatch, variable):
    # CPUID still reports AVX-512 BF16 under the cap, but oneDNN then emulates BF16 (10x slower than FP32): auto must
    # pick FP32 as it does on an AVX2-only CPU, and say why.
    for name in precision_module.ONEDNN_ISA_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, "avx2")
    assert not precision_module.cpu_has_native_bf16()
    auto = resolve_precision("auto", torch.device("cpu"))
    assert auto.name == "fp32" and f"{variable}=avx2" in auto.reason
    asked = resolve_precision("bf16", torch.device("cpu"))
    assert asked.name == "bf16" and "emulated" in asked.reason  # asked for by name: kept, the cost said
    assert safer_precision("fp16", "cpu") == "fp32"


def test_a_cap_that_keeps_bf16_changes_nothing(monkeypatch):
    for name in precision_module.ONEDNN_ISA_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    uncapped = precision_module.cpu_has_native_bf16()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")
    assert precision_module.cpu_has_native_bf16() == uncapped
