"""``python -m detector benchmark``: per-image pre-process / inference / post-process time for each backend.

Given a ``.pt`` checkpoint it times PyTorch FP32, PyTorch autocast (FP16 on CUDA, BF16 on CPUs with
native BF16), ONNX Runtime FP32 and FP16 (exported to a temporary folder), and TensorRT when it can be
built here; given an ``.onnx`` or ``.engine`` file it times that file alone. Printed as a markdown table
of median milliseconds per image over ``--runs`` timed batches after ``--warmup`` untimed ones.
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from detector.checkpoint import model_from_checkpoint
from detector.data.synthetic import make_image
from detector.device import resolve_device
from detector.exporting.tensorrt import build_engine
from detector.extras import MissingExtra, require
from detector.inference import Backend, load_backend, prepare_batch, to_original_pixels, weights_or_latest
from detector.inference.tensorrt_backend import tensorrt_missing
from detector.inference.torch_backend import DEFAULT_IMGSZ, TorchBackend
from detector.precision import cpu_has_native_bf16
from detector.tuning import enlarge_onednn_cache
from detector.options import Options, option


@dataclass(kw_only=True)
class BenchmarkOptions(Options):
    """The flags of ``python -m detector benchmark``."""

    weights: Path | None = option(None, ".pt (all backends) or one .onnx/.engine (default: the newest "
                                        "runs/train/*/weights/best.pt)")
    imgsz: int | None = option(None, f"input size for .pt weights (default: the training size, else {DEFAULT_IMGSZ})")
    batch: int = option(1, "images per call (default: 1)")
    runs: int = option(20, "timed batches per backend (default: 20)")
    warmup: int = option(3, "untimed batches first (default: 3)")
    device: str = option("", "cpu or cuda (default: cuda if available, else cpu)")


def sample_images(count: int, seed: int = 0) -> list[np.ndarray]:
    """Deterministic 480x640 RGB images (a 4:3 frame, so the letterbox pads like on real photos)."""
    rng = np.random.default_rng(seed)
    return [make_image(rng, 640)[0][80:560] for _ in range(count)]


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_backend(
    backend: Backend, images: list[np.ndarray], *, size: int, runs: int, warmup: int, device: str
) -> dict[str, float]:
    """Median per-image milliseconds of each stage (inference includes host<->device copies)."""
    stages: dict[str, list[float]] = {"pre-process": [], "inference": [], "post-process": []}
    for run in range(warmup + runs):
        marks = [time.perf_counter()]
        batch, transforms = prepare_batch(images, size)
        marks.append(time.perf_counter())
        raw = backend.infer(batch)
        synchronize(device)
        marks.append(time.perf_counter())
        for result, transform in zip(backend.postprocess(raw), transforms):
            to_original_pixels(result, transform)
        marks.append(time.perf_counter())
        if run >= warmup:
            for stage, start, end in zip(stages, marks, marks[1:]):
                stages[stage].append(1000 * (end - start) / len(images))
    return {stage: statistics.median(values) for stage, values in stages.items()}


def backends_for_checkpoint(
    weights: Path, *, imgsz: int | None, batch: int, device: str, folder: Path
) -> Iterator[Backend | str]:
    """Yield each backend in turn (built lazily, so exports happen just before they are timed), or a skip note."""
    model, _ = model_from_checkpoint(weights)
    reference = TorchBackend.from_checkpoint(weights, imgsz=imgsz, device=device)
    yield reference
    if device.startswith("cuda"):
        yield TorchBackend(model, reference.info, device=device, precision="fp16")
    elif cpu_has_native_bf16():
        yield TorchBackend(model, reference.info, device=device, precision="bf16")
    else:
        yield "pytorch bf16 autocast: skipped (this CPU has no native BF16)"
    try:
        for module in ("onnxruntime", "onnx"):  # onnx: the export that makes the graphs timed here
            require(module, "export", "timing ONNX Runtime")
    except MissingExtra as missing:
        yield f"onnxruntime: skipped ({missing})"
        return
    from detector.exporting.onnx import export_onnx
    static = dataclasses.replace(reference.info, dynamic=False, batch=batch)
    for precision in ("fp32", "fp16"):
        info = dataclasses.replace(static, precision=precision)
        yield load_backend(export_onnx(model, folder / f"{precision}.onnx", info, device=device), device=device)
    if (reason := tensorrt_missing()) is not None:
        yield f"tensorrt: skipped ({reason})"
        return
    for precision in ("fp32", "fp16"):
        info = dataclasses.replace(static, precision=precision)
        build_engine(folder / "fp32.onnx", folder / f"{precision}.engine", info)
        yield load_backend(folder / f"{precision}.engine", device=device)


def markdown_table(rows: list[tuple[str, dict[str, float]]], notes: list[str]) -> str:
    lines = ["| backend | pre-process ms | inference ms | post-process ms | total ms |", "|---|---:|---:|---:|---:|"]
    for name, times in rows:
        cells = [f"{times[stage]:.2f}" for stage in ("pre-process", "inference", "post-process")]
        lines.append(f"| {name} | {' | '.join(cells)} | {sum(times.values()):.2f} |")
    return "\n".join(lines + [f"\n{note}" for note in notes])


def run_benchmark(options: BenchmarkOptions, progress: Callable[[str], None] = print) -> str:
    """Time every backend; -> a header line and the markdown table (``progress`` gets one line per backend).

    Raises:
        CheckpointError, FileNotFoundError, ValueError, RuntimeError: one line naming the file or flag.
    """
    enlarge_onednn_cache()  # before the first convolution: see detector/tuning.py
    device = str(resolve_device(options.device))
    weights = weights_or_latest(options.weights)
    images = sample_images(options.batch)
    rows, notes = [], []
    with tempfile.TemporaryDirectory(prefix="detector-benchmark-") as folder:
        if Path(weights).suffix == ".pt":
            candidates: Iterator[Backend | str] = backends_for_checkpoint(
                Path(weights), imgsz=options.imgsz, batch=options.batch, device=device, folder=Path(folder)
            )
        else:
            candidates = iter([load_backend(weights, device=device)])
        for backend in candidates:
            if isinstance(backend, str):
                notes.append(backend)
                continue
            size = options.imgsz if backend.info.dynamic and options.imgsz else backend.info.imgsz
            progress(f"timing {backend.name} at {size} px ...")
            times = time_backend(backend, images, size=size, runs=options.runs, warmup=options.warmup, device=device)
            rows.append((backend.name, times))
    threads = torch.get_num_threads()
    header = f"{weights}, batch {options.batch}, {device} ({threads} torch threads), median of {options.runs} runs\n\n"
    return header + markdown_table(rows, notes)
