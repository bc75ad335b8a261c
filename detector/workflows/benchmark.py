"""``python -m detector benchmark``: batch-1 latency and batch-32 throughput of every backend present.

Given a ``.pt`` checkpoint it times PyTorch FP32, PyTorch ``--half`` where it pays (FP16 + CUDA graphs on CUDA,
BF16 on CPUs with native BF16), ONNX Runtime FP32 and FP16 and the pt2 (AOTInductor) package (FP32, and
``--half``'s precision where it has one), each exported to a temporary folder, and TensorRT when it can be built
here; given an ``.onnx``, ``.engine`` or ``.pt2`` file it times that file alone. Printed as a markdown table:
median milliseconds per image of each stage at ``--batch`` (1) over ``--runs`` timed batches after ``--warmup``
untimed ones, and images per second at ``--throughput-batch`` (32), with the device's name in the header.
"""

from __future__ import annotations

import dataclasses
import platform
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
from detector.inference import Backend, batch_to_original_pixels, load_backend, prepare_batch, weights_or_latest
from detector.inference.tensorrt_backend import tensorrt_missing
from detector.inference.torch_backend import TorchBackend, half_precision
from detector.model import YOLO
from detector.model.metadata import ModelInfo
from detector.tuning import tune_process
from detector.workflows.options import BenchmarkOptions, skipped

STAGES = ("pre-process", "inference", "post-process")


@dataclass
class Candidate:
    """A backend to time, built per batch size (fixed-shape exports need one file per batch)."""

    name: str
    build: Callable[[int], Backend]


def device_name(device: str) -> str:
    """The GPU's name, or the CPU's model name from /proc/cpuinfo (``platform.processor()`` elsewhere)."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="ignore").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def sample_images(count: int, seed: int = 0) -> list[np.ndarray]:
    """Deterministic 480x640 RGB images (a 4:3 frame, so the letterbox pads like on real photos)."""
    rng = np.random.default_rng(seed)
    return [make_image(rng, 640)[0][80:560] for _ in range(count)]


def synchronize(device: torch.device | str) -> None:
    """Wait for ``device``'s queued work (that GPU's, not the current one's); nothing on a CPU."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_backend(
    backend: Backend, images: list[np.ndarray], *, size: int, runs: int, warmup: int, device: str
) -> dict[str, float]:
    """Median per-image milliseconds of each stage (inference includes host<->device copies).

    On CUDA the letterbox runs on the GPU (``prepare_batch`` with the backend's device), so pre-process
    includes the upload of the uint8 originals.
    """
    stages: dict[str, list[float]] = {stage: [] for stage in STAGES}
    target = getattr(backend, "device", None)
    device = target if target is not None else device  # a .engine runs on CUDA whatever --device says
    for run in range(warmup + runs):
        marks = [time.perf_counter()]
        batch, transforms = prepare_batch(images, size, device=target)
        synchronize(device)
        marks.append(time.perf_counter())
        raw = backend.infer(batch)
        synchronize(device)
        marks.append(time.perf_counter())
        batch_to_original_pixels(backend.postprocess(raw), transforms)
        marks.append(time.perf_counter())
        if run >= warmup:
            for stage, start, end in zip(stages, marks, marks[1:]):
                stages[stage].append(1000 * (end - start) / len(images))
    return {stage: statistics.median(values) for stage, values in stages.items()}


def per_batch(build: Callable[[int], Backend]) -> Callable[[int], Backend]:
    """Build once per batch size and keep it."""
    built: dict[int, Backend] = {}

    def get(batch: int) -> Backend:
        if batch not in built:
            built[batch] = build(batch)
        return built[batch]

    return get


def backends_for_checkpoint(
    weights: Path, *, imgsz: int | None, device: str, folder: Path, skip: set[str]
) -> Iterator[Candidate | str]:
    """Yield each backend to time (built lazily, so exports happen just before they are timed), or a skip note."""
    model, _ = model_from_checkpoint(weights)
    reference = TorchBackend.from_checkpoint(weights, imgsz=imgsz, device=device)
    if "pytorch" not in skip:
        yield Candidate(reference.name, lambda batch: reference)
        half = half_precision(device)
        if half == "fp32":
            yield "pytorch --half: skipped (FP32 is what --half runs on this CPU: it has no native BF16)"
        else:
            fast = TorchBackend(model, reference.info, device=device, precision=half)
            yield Candidate(fast.name, lambda batch: fast)
    static = dataclasses.replace(reference.info, dynamic=False)
    if "onnx" not in skip:
        yield from onnx_candidates(model, static, device, folder)
    if "pt2" not in skip:
        yield from pt2_candidates(model, static, device, folder)
    if "engine" in skip:
        return
    if (reason := tensorrt_missing()) is not None:
        yield f"tensorrt: skipped ({reason})"
        return
    for precision in ("fp32", "fp16"):
        def build(batch: int, precision: str = precision) -> Backend:
            info = dataclasses.replace(static, precision=precision, batch=batch)
            source = onnx_file(model, info, device, folder)  # its types are the engine's
            engine = build_engine(source, folder / f"{precision}-{batch}.engine", info, device=device)
            return load_backend(engine, device=device)

        yield Candidate(f"tensorrt {precision}", per_batch(build))


def onnx_candidates(model: YOLO, static: ModelInfo, device: str, folder: Path) -> Iterator[Candidate | str]:
    """ONNX Runtime FP32 and FP16, one fixed-shape export per batch size."""
    try:
        for module in ("onnxruntime", "onnx"):  # onnx: the export that makes the graphs timed here
            require(module, "export", "timing ONNX Runtime")
    except MissingExtra as missing:
        yield f"onnxruntime: skipped ({missing})"
        return
    for precision in ("fp32", "fp16"):
        def build(batch: int, precision: str = precision) -> Backend:
            info = dataclasses.replace(static, precision=precision, batch=batch)
            return load_backend(onnx_file(model, info, device, folder), device=device)

        yield Candidate(f"onnxruntime {precision}", per_batch(build))


def onnx_file(model: YOLO, info: ModelInfo, device: str, folder: Path) -> Path:
    """The fixed-shape ONNX export for ``info`` (precision, batch) in ``folder``: made once, read by ONNX Runtime's
    candidate and TensorRT's alike."""
    path = folder / f"{info.precision}-{info.batch}.onnx"
    if path.is_file():
        return path
    from detector.exporting.onnx import export_onnx

    return export_onnx(model, path, info, device=device)


def pt2_candidates(model: YOLO, static: ModelInfo, device: str, folder: Path) -> Iterator[Candidate | str]:
    """The pt2 package in FP32, and in what ``--half`` exports here (FP16 on CUDA, BF16 on a CPU with native BF16,
    where it is the fastest CPU backend: docs/inference.md): one compile each (its batch is free)."""
    from detector.exporting.pt2 import compiler_missing, export_pt2

    if (reason := compiler_missing()) is not None:
        yield f"pt2: skipped ({reason})"
        return
    half = half_precision(device)
    for precision in ("fp32",) if half == "fp32" else ("fp32", half):
        def build(batch: int, precision: str = precision) -> Backend:
            info = dataclasses.replace(static, precision=precision)
            return load_backend(export_pt2(model, folder / f"{precision}.pt2", info, device=device), device=device)

        built = per_batch(build)
        yield Candidate(f"pt2 {precision}", lambda batch, built=built: built(1))


def markdown_table(rows: list[tuple[str, dict[str, float]]], notes: list[str], *, throughput_batch: int = 0) -> str:
    """Rows of stage times (ms per image), plus ``throughput`` (images/s at ``throughput_batch``) and that batch's
    stage times (``batch <stage>``, ms per image) when measured."""
    columns = "| backend | pre-process ms | inference ms | post-process ms | total ms |"
    rule = "|---|---:|---:|---:|---:|"
    if throughput_batch:
        # Its stages too: at a big batch the model's share can be small, and a precision speeds up only that share.
        columns += f" batch-{throughput_batch} images/s | batch-{throughput_batch} pre / inference / post ms |"
        rule += "---:|---:|"
    lines = [columns, rule] + [markdown_row(name, times, throughput_batch) for name, times in rows]
    return "\n".join(lines + [f"\n{note}" for note in notes])


def markdown_row(name: str, times: dict[str, float], throughput_batch: int = 0) -> str:
    """One backend's line of :func:`markdown_table`."""
    cells = [f"{times[stage]:.2f}" for stage in STAGES] + [f"{sum(times[stage] for stage in STAGES):.2f}"]
    if throughput_batch:
        cells.append(f"{times['throughput']:.1f}" if "throughput" in times else "-")
        big = [times.get(f"batch {stage}") for stage in STAGES]
        cells.append(" / ".join(f"{value:.3f}" for value in big) if None not in big else "-")
    return f"| {name} | {' | '.join(cells)} |"


def run_benchmark(options: BenchmarkOptions, progress: Callable[[str], None] = print) -> str:
    """Time every backend; -> a header line (weights, device name, threads) and the markdown table.

    ``progress`` gets one line per backend and batch size.

    Raises:
        CheckpointError, FileNotFoundError, ValueError, Unavailable: one line naming the file or flag.
    """
    resolved = resolve_device(options.device)
    tune_process(resolved)  # before the first convolution: see detector/tuning.py
    device = str(resolved)
    weights = weights_or_latest(options.weights)
    rows, notes = [], []
    with tempfile.TemporaryDirectory(prefix="detector-benchmark-") as folder:
        if Path(weights).suffix == ".pt":
            candidates: Iterator[Candidate | str] = backends_for_checkpoint(
                Path(weights), imgsz=options.imgsz, device=device, folder=Path(folder), skip=skipped(options.skip)
            )
        else:
            single = load_backend(weights, device=device)
            candidates = iter([Candidate(single.name, lambda batch: single)])
        for candidate in candidates:
            if isinstance(candidate, str):
                notes.append(candidate)
                continue
            try:
                rows.append(time_candidate(candidate, options, device, progress))
            # One backend failing keeps the others' rows, whatever it raises: onnxruntime's own errors (Fail,
            # EPFail) are plain Exceptions, and a TensorRT release without an API we call raises AttributeError.
            except Exception as error:  # noqa: BLE001 - reported in the table's notes, with its type
                reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
                notes.append(f"{candidate.name}: failed ({type(error).__name__}: {reason})")
                progress(notes[-1])
            else:  # each row as soon as it is measured: a run stopped by a time limit keeps the rows before it
                progress(markdown_row(*rows[-1], options.throughput_batch))
    threads = torch.get_num_threads()
    header = (f"{weights} on {device} ({device_name(device)}, {threads} torch threads): ms per image at batch "
              f"{options.batch}, median of {options.runs} runs")
    if options.throughput_batch:
        header += f"; images/s at batch {options.throughput_batch}, median of {options.throughput_runs} runs"
    return header + "\n\n" + markdown_table(rows, notes, throughput_batch=options.throughput_batch)


def time_candidate(
    candidate: Candidate, options: BenchmarkOptions, device: str, progress: Callable[[str], None]
) -> tuple[str, dict[str, float]]:
    """The row's name and its latency stages at ``--batch``, and ``throughput`` (images/s) at
    ``--throughput-batch`` when asked for. The name is the backend's own (ONNX Runtime names its GPU provider),
    with "on cpu" where it ran on the CPU though the table is for a GPU (a CPU-only onnxruntime build)."""
    times: dict[str, float] = {}
    name = candidate.name
    plan = [(options.batch, options.runs, False)]
    if options.throughput_batch:
        plan.append((options.throughput_batch, options.throughput_runs, True))
    for batch, runs, throughput in plan:
        backend = candidate.build(batch)
        size = options.imgsz if backend.info.dynamic and options.imgsz else backend.info.imgsz
        progress(f"timing {backend.name} at {size} px, batch {batch} ...")
        measured = time_backend(backend, sample_images(batch), size=size, runs=runs, warmup=options.warmup,
                                device=device)
        ran_on = getattr(backend, "device", None)  # after the runs: the name says what ran (a failed CUDA graph)
        name = backend.name + (" on cpu" if device.startswith("cuda") and ran_on is not None
                               and torch.device(ran_on).type == "cpu" else "")
        if throughput:
            times["throughput"] = 1000 / sum(measured.values())
            times.update({f"batch {stage}": value for stage, value in measured.items()})
        else:
            times.update(measured)
    return name, times
