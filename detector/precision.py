"""Everything about numeric precision: choosing it, autocast, the gradient scaler, strict FP32.

One code path for every precision: ``autocast(enabled=...)`` and ``GradScaler(enabled=...)`` turn
themselves off, so the training step has no AMP/no-AMP branches.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from detector.choices import PRECISION as CHOICES

# The fallback ladder, least safe first: FP16's 5-bit exponent overflows where BF16's (FP32's range) does not.
LADDER = ("fp16", "bf16", "fp32")


@dataclass(frozen=True)
class Precision:
    name: str  # "fp16" | "bf16" | "fp32"
    device_type: str  # "cuda" | "cpu" | ...
    reason: str  # one line: why this precision was chosen

    @property
    def dtype(self) -> torch.dtype | None:
        return {"fp16": torch.float16, "bf16": torch.bfloat16}.get(self.name)

    @property
    def uses_scaler(self) -> bool:
        # BF16 keeps FP32's exponent range, so only FP16 needs loss scaling.
        return self.name == "fp16"

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def make_scaler(self) -> torch.amp.GradScaler:
        return torch.amp.GradScaler(self.device_type, enabled=self.uses_scaler)


# oneDNN's instruction-set caps (``ONEDNN_MAX_CPU_ISA``, or its older name ``DNNL_MAX_CPU_ISA``) below
# AVX512_CORE_BF16: under them its convolutions emulate BF16 (measured 10x slower than FP32 on an AVX-512 BF16 EPYC),
# though CPUID still reports the instructions. AVX2_VNNI_2 counts as none: it converts BF16 but has no BF16 dot product.
ONEDNN_ISA_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
ISA_CAPS_WITHOUT_BF16 = frozenset({"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE",
                                   "AVX512_CORE_VNNI"})


def onednn_cap_without_bf16() -> str | None:
    """``"ONEDNN_MAX_CPU_ISA=AVX2"`` where the environment caps oneDNN below native BF16, else None."""
    for variable in ONEDNN_ISA_VARIABLES:
        value = os.environ.get(variable, "").strip()
        if value:  # oneDNN reads the first one set
            return f"{variable}={value}" if value.upper() in ISA_CAPS_WITHOUT_BF16 else None
    return None


def cpu_has_native_bf16() -> bool:
    """True where the CPU computes BF16 in hardware (AVX-512 BF16 or AMX) and oneDNN may use it; emulated BF16 is
    slower than FP32."""
    if onednn_cap_without_bf16():
        return False
    checker = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    if checker is not None and checker():
        return True
    amx = getattr(torch.cpu, "_is_amx_tile_supported", None)
    if amx is not None and amx():
        return True
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        flags = cpuinfo.read_text(errors="ignore")
        return "avx512_bf16" in flags or "amx_bf16" in flags
    return False


def gpu_has_native_bf16() -> bool:
    """True on CUDA GPUs that compute BF16 in hardware (Ampere and newer).

    ``torch.cuda.is_bf16_supported()`` also answers True where BF16 is only emulated (T4, V100), which is
    slower than FP32 there, so emulation is excluded (the keyword exists from torch 2.4; older: by arch).
    """
    if not torch.cuda.is_available():
        return False
    try:
        return torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:
        return torch.cuda.get_device_capability()[0] >= 8


def has_native_bf16(device_type: str) -> bool:
    """Native BF16 on this kind of device: the one test used by the choice and by every fallback."""
    if device_type == "cuda":
        return gpu_has_native_bf16()
    if device_type == "cpu":
        return cpu_has_native_bf16()
    return False


def safer_precision(name: str, device_type: str) -> str | None:
    """The next rung down the ladder that this device runs natively; None below FP32."""
    for candidate in LADDER[LADDER.index(name) + 1:]:
        if candidate != "bf16" or has_native_bf16(device_type):
            return candidate
    return None


def fallback_chain(precision: Precision) -> list[Precision]:
    """The chosen precision, then every safer one this device runs natively, ending in FP32."""
    chain = [precision]
    while (safer := safer_precision(chain[-1].name, precision.device_type)) is not None:
        chain.append(Precision(safer, precision.device_type, f"fell back from {chain[-1].name.upper()}"))
    return chain


def safest(first: Precision, second: Precision) -> Precision:
    """Of two precisions, the one further down the ladder (the first on a tie)."""
    return second if LADDER.index(second.name) > LADDER.index(first.name) else first


def resolve_precision(requested: str, device: torch.device, *, unamp: bool = False) -> Precision:
    """Pick the training precision for ``device``.

    ``auto``: FP16 on CUDA (with dynamic loss scaling), BF16 on a CPU with native BF16, else FP32.
    ``unamp`` overrides everything: true FP32, no autocast, no scaler, TF32 off.
    """
    if requested not in CHOICES:
        raise ValueError(f"unknown precision {requested!r}; choose one of {', '.join(CHOICES)}")
    device_type = device.type
    if unamp:
        set_strict_fp32()
        return Precision("fp32", device_type, "--unamp: true FP32 (no autocast, no loss scaling, TF32 off)")
    if requested == "fp32":
        return Precision("fp32", device_type, "--precision fp32 requested")
    if requested == "fp16":
        if device_type == "cpu":
            hint = " (--precision bf16 is native on this CPU)" if cpu_has_native_bf16() else ""
            return Precision("fp32", device_type, f"FP16 autocast is not worthwhile on CPU; using FP32{hint}")
        return Precision("fp16", device_type, "--precision fp16 requested (dynamic loss scaling on)")
    if requested == "bf16":
        if device_type == "cuda" and not gpu_has_native_bf16():
            return Precision("fp32", device_type, "this GPU has no native BF16 (only emulated); using FP32")
        if device_type == "cpu" and not cpu_has_native_bf16():  # asked for by name: kept, with the cost said
            return Precision("bf16", device_type, f"--precision bf16 requested; warning: {_no_native_cpu_bf16()}, "
                                                  "so it is emulated and slower than FP32")
        return Precision("bf16", device_type, "--precision bf16 requested")
    if device_type == "cuda":
        return Precision("fp16", device_type, "auto: CUDA device, FP16 autocast with dynamic loss scaling")
    if device_type == "cpu":
        if cpu_has_native_bf16():
            return Precision("bf16", device_type, "auto: CPU has native BF16 (AVX-512 BF16/AMX), BF16 autocast")
        return Precision("fp32", device_type, f"auto: {_no_native_cpu_bf16()}; FP32")
    return Precision("fp32", device_type, f"auto: no native reduced precision on {device_type}; FP32")


def _no_native_cpu_bf16() -> str:
    """Why this CPU gets no native BF16: the hardware, or an instruction-set cap in the environment."""
    cap = onednn_cap_without_bf16()
    return f"{cap} caps oneDNN below native BF16" if cap else "this CPU has no native BF16 (AVX-512 BF16/AMX)"


def set_strict_fp32() -> None:
    """Disable TF32 so FP32 ablations are really FP32 on Ampere+ GPUs (for the run: :func:`fp32_settings_kept`)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


@contextlib.contextmanager
def fp32_settings_kept() -> Iterator[None]:
    """The TF32 settings put back as they were on exit: ``--unamp`` makes its own run strict FP32, not whatever a
    Python session trains or evaluates after it."""
    matmul, convolutions = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    matmul_precision = torch.get_float32_matmul_precision()
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, convolutions
        torch.set_float32_matmul_precision(matmul_precision)
