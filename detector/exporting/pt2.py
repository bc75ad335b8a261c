"""Model -> ``.pt2``: ``torch.export`` of the export wrapper, compiled and packaged by AOTInductor.

The package holds the compiled network + box decode as native code (C++ on the CPU, Triton kernels on CUDA)
and the weights; :class:`detector.inference.pt2_backend.Pt2Backend` runs it without the model's Python code.
Inputs and outputs are those of :class:`~detector.exporting.wrapper.ExportWrapper` (``images`` float32 in,
``boxes`` + ``scores`` or, with ``--nms``, ``detections`` + ``num_detections`` out) and the metadata of
:mod:`detector.model.metadata` is stored in the package (AOTInductor's own ``aot_inductor.metadata``).

* **Batch**: ``--batch`` (1 by default), fixed, as in the ONNX export; with ``info.batch_free`` (``--dynamic``) free
  (``torch.export.Dim``, 1..:data:`MAX_BATCH`; traced at 2 or more: 1 would specialise). A fixed batch lets
  Inductor pack the convolution weights into oneDNN's blocked layout once, at compile time; with a free batch it
  packs them at every call: the nano model at 640 px, batch 1, took 30.7 ms a call free against 25.2 fixed on a
  2-core AMD EPYC (docs/inference.md). Height and width are always fixed at ``imgsz``.
* **Precision**: FP32 on the CPU; ``--half`` is FP16 on CUDA, or BF16 on a CPU with native BF16 (elsewhere
  refused: emulated BF16 is slower than FP32).
* **Device**: the package runs on the kind of device it was compiled on (``--device``).
* **Compiler**: compiling needs a C++ compiler (``g++``, or ``$CXX``) at export time only; loading does not.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import torch

from detector.exporting import ExportError
from detector.exporting.wrapper import ExportWrapper
from detector.extras import Unavailable
from detector.files import publish, staging_folder
from detector.inference.pt2_backend import quiet_cpp_builder
from detector.model import YOLO
from detector.model.metadata import INPUT_NAME, ModelInfo, encode_metadata
from detector.precision import has_native_bf16

MAX_BATCH = 1024
COMPUTE_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def compiler_missing() -> str | None:
    """``None`` when the C++ compiler AOTInductor would call is on ``PATH``, else a one-line reason.

    Inductor tries each entry of ``torch._inductor.config.cpp.cxx`` in turn (``$CXX``, else ``g++``; ``None``
    stands for an opt-in conda download, which we do not count).
    """
    from torch._inductor import config

    candidates = config.cpp.cxx if isinstance(config.cpp.cxx, (list, tuple)) else (config.cpp.cxx,)
    names = [name for name in candidates if name]
    if any(shutil.which(name) for name in names):
        return None
    return (f"pt2 export compiles C++ and needs a compiler at export time ({' or '.join(names) or 'g++'}, "
            "or set $CXX); none is on PATH")


def pt2_precision(half: bool, device: str) -> str:
    """``--half`` -> the precision a pt2 package gets on ``device``; ``ValueError`` where it would not pay."""
    if not half:
        return "fp32"
    kind = torch.device(device).type
    if kind == "cuda":
        return "fp16"
    if has_native_bf16(kind):
        return "bf16"
    raise ValueError(f"pt2 --half is FP16 on CUDA or BF16 on a CPU with native BF16; this {kind} has neither "
                     "(drop --half: FP32 is the fast choice here)")


def export_program(model: YOLO, info: ModelInfo, *, device: str) -> torch.export.ExportedProgram:
    """``torch.export`` of the wrapper at ``info.batch``, or with a free batch dimension where ``info.batch_free``
    (traced at batch >= 2 then: 1 would specialise)."""
    if info.dynamic:
        raise ValueError("pt2 export takes a fixed --imgsz (--dynamic frees its batch alone: batch_free)")
    wrapper = ExportWrapper(model, nms=info.nms, compute_dtype=COMPUTE_DTYPES[info.precision],
                            end_to_end=info.end_to_end).to(device)
    free = bool(info.batch_free)
    example = torch.zeros(max(2, info.batch) if free else info.batch, 3, info.imgsz, info.imgsz, device=device)
    shapes = {INPUT_NAME: {0: torch.export.Dim("batch", min=1, max=MAX_BATCH)}} if free else None
    with torch.no_grad():
        return torch.export.export(wrapper, (example,), dynamic_shapes=shapes, strict=False)


def export_pt2(model: YOLO, path: str | Path, info: ModelInfo, *, device: str = "cpu") -> Path:
    """Compile ``model`` (FP32 weights; cast inside for ``info.precision`` fp16/bf16) into the package ``path``.

    Compiled in a staging folder beside ``path`` and renamed into place, so a failure leaves nothing.
    Raises :class:`~detector.extras.Unavailable` (no compiler) or ``ValueError`` (``info.dynamic``: a free height and
    width) before any work. The package's metadata always says ``batch_free`` (None is taken as fixed).
    """
    if (reason := compiler_missing()) is not None:
        raise Unavailable(reason)
    path = Path(path)
    info = dataclasses.replace(info, batch_free=bool(info.batch_free))
    program = export_program(model, info, device=device)
    # Freezing folds the weights into the graph as constants, so BatchNorm folds into the convolutions and the CPU
    # ones become oneDNN convolutions with the SiLU fused in. Inductor freezes only a compile that runs with
    # gradients off (torch.no_grad below); with them on, the setting is silently ignored.
    configs = {"aot_inductor.metadata": encode_metadata(info), "freezing": True}
    with staging_folder(path.parent) as staging:
        try:
            with torch.no_grad(), quiet_cpp_builder():
                staged = torch._inductor.aoti_compile_and_package(
                    program, package_path=str(staging / path.name), inductor_configs=configs
                )
        except Exception as error:
            if (problem := compile_problem(error)) is None:
                raise
            raise ExportError(f"{path}: the pt2 compile failed: {problem}; nothing was written") from error
        return publish(Path(staged), path)


def compile_problem(error: BaseException) -> str | None:
    """One line for a compile that failed on this machine's tools (a compiler error, a missing header, no working
    Triton): the compiler's first error line, else the first line of the message. None for anything else (a
    bug keeps its traceback). Inductor wraps the tool's error in ``InductorError.inner_exception``."""
    from torch._inductor import exc

    inner = getattr(error, "inner_exception", error)
    if isinstance(inner, exc.CppCompileError):
        errors = [line.strip() for line in inner.output.splitlines() if "error" in line.lower()]
        return errors[0] if errors else "the C++ compiler exited with an error"
    if isinstance(inner, (exc.InvalidCxxCompiler, exc.TritonMissing, exc.GPUTooOldForTriton)):
        return " ".join(str(inner).split())[:300]
    return None
