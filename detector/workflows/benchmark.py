"""``python -m detector benchmark``: batch-1 latency and batch-32 throughput of every backend present.

Given a ``.pt`` checkpoint it times PyTorch FP32, PyTorch ``--half`` where it pays (FP16 + CUDA graphs on CUDA,
BF16 on CPUs with native BF16), ONNX Runtime FP32 and FP16 and the pt2 (AOTInductor) package (FP32, and
``--half``'s precision where it has one), each exported to a temporary folder, and TensorRT when it can be built
here; given an ``.onnx``, ``.engine`` or ``.pt2`` file it times that file alone. Printed as a markdown table:
median milliseconds per image of each stage at ``--batch`` (1) over ``--runs`` timed batches after ``--warmup``
untimed ones, and images per second at ``--throughput-batch`` (32), with the device's name in the header. The
backends are timed in interleaved rounds (``--rounds``), so that a machine's drift slows them all alike.
"""

from __future__ import annotations

import dataclasses
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from detector.inference.pt_model import model_from_pt
from detector.data.synthetic import make_image
from detector.device import resolve_device
from detector.exporting.tensorrt import build_engine
from detector.extras import MissingExtra, require
from detector.inference import Backend, batch_to_original_pixels, load_backend, prepare_batch, weights_or_latest
from detector.inference.tensorrt_backend import tensorrt_missing
from detector.inference.torch_backend import TorchBackend, half_precision
from detector.model import YOLO
from detector.model.metadata import ModelInfo
from detector.postprocess import NMSConfig
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


def time_runs(
    backend: Backend, images: list[np.ndarray], *, size: int, runs: int, device: str,
    into: dict[str, list[float]] | None = None,
) -> dict[str, list[float]]:
    """Time ``runs`` batches of ``images``: each stage's milliseconds per image, one entry per batch, appended to
    ``into`` (a new dict by default). Inference includes host<->device copies.

    On CUDA the letterbox runs on the GPU (``prepare_batch`` with the backend's device), so pre-process
    includes the upload of the uint8 originals.
    """
    stages = into if into is not None else {stage: [] for stage in STAGES}
    target = getattr(backend, "device", None)
    device = target if target is not None else device  # a .engine runs on CUDA whatever --device says
    for _ in range(runs):
        marks = [time.perf_counter()]
        batch, transforms = prepare_batch(images, size, device=target)
        synchronize(device)
        marks.append(time.perf_counter())
        raw = backend.infer(batch)
        synchronize(device)
        marks.append(time.perf_counter())
        batch_to_original_pixels(backend.postprocess(raw), transforms)
        marks.append(time.perf_counter())
        for stage, start, end in zip(STAGES, marks, marks[1:]):
            stages[stage].append(1000 * (end - start) / len(images))
    return stages


@dataclass
class Timed:
    """One candidate at one batch size, timed in rounds beside the others (:func:`time_in_rounds`)."""

    candidate: str
    backend: Backend
    images: list[np.ndarray]
    size: int
    runs: int
    throughput: bool
    stages: dict[str, list[float]] = field(default_factory=lambda: {stage: [] for stage in STAGES})

    def medians(self) -> dict[str, float]:
        return {stage: statistics.median(values) for stage, values in self.stages.items()}


def round_shares(runs: int, rounds: int) -> list[int]:
    """``runs`` timed batches spread over ``rounds`` as evenly as they go, the first rounds taking the remainder."""
    return [runs // rounds + (1 if index < runs % rounds else 0) for index in range(rounds)]


def time_in_rounds(timed: list[Timed], *, rounds: int, device: str, failed: Callable[[str, Exception], None],
                   progress: Callable[[str], None]) -> int:
    """Time every entry's runs in ``rounds`` rounds (fewer where no entry has that many runs), each round giving
    every entry its share in turn; -> the rounds run.

    Why: on a shared machine the speed of the same backend drifts by 10-25% over minutes (docs/inference.md), so
    backends timed one after the other compare moments as much as backends; interleaved, a drift slows them all
    alike. Each round's first batch of an entry follows another backend's: alternating ONNX Runtime and pt2 call by
    call at batch 1 slowed neither beyond the drift (docs/inference.md), so no untimed batch is spent there. A
    candidate that raises is reported through ``failed`` and leaves the rounds (its other batch size too).
    """
    out: set[str] = set()
    rounds = min(rounds, max((entry.runs for entry in timed), default=1))  # no round without a timed batch
    for index in range(rounds):
        for entry in timed:
            if entry.candidate in out:
                continue
            try:
                time_runs(entry.backend, entry.images, size=entry.size, runs=round_shares(entry.runs, rounds)[index],
                          device=device, into=entry.stages)
            except Exception as error:  # noqa: BLE001 - the caller notes it (onnxruntime raises plain Exceptions)
                out.add(entry.candidate)
                failed(entry.candidate, error)
        latency = [entry for entry in timed if not entry.throughput and entry.candidate not in out and
                   entry.stages[STAGES[0]]]
        progress(f"round {index + 1}/{rounds}: " + ", ".join(
            f"{entry.candidate} {sum(entry.medians().values()):.2f} ms" for entry in latency))
    timed[:] = [entry for entry in timed if entry.candidate not in out]
    return rounds


def per_batch(build: Callable[[int], Backend]) -> Callable[[int], Backend]:
    """Build once per batch size and keep it."""
    built: dict[int, Backend] = {}

    def get(batch: int) -> Backend:
        if batch not in built:
            built[batch] = build(batch)
        return built[batch]

    return get


def backends_for_checkpoint(
    weights: Path, *, imgsz: int | None, device: str, folder: Path, skip: set[str],
    progress: Callable[[str], None] = print, end_to_end: bool = False,
) -> Iterator[Candidate | str]:
    """Yield each backend to time (built lazily, so exports happen just before they are timed), or a skip note.
    ``end_to_end``: every one runs the one-to-one head (YOLO26) and the NMS-free top-k, the exports made so."""
    model, checkpoint = model_from_pt(weights)  # ours, or Ultralytics YOLOv8/YOLO11/YOLO26 weights, as val reads them
    # Refuses --end-to-end in one line for a model without that head; its info's end_to_end reaches every export.
    reference = TorchBackend.from_model(model, checkpoint, imgsz=imgsz, device=device,
                                        nms=NMSConfig(end_to_end=end_to_end), source=str(weights))
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
        yield from pt2_candidates(model, static, device, folder, progress=progress)
    if "engine" in skip:
        return
    if torch.device(device).type != "cuda":  # an engine runs on a GPU only: not a row of another device's table
        yield f"tensorrt: skipped (engines run on a CUDA GPU; this table is {device}'s)"
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


def pt2_candidates(
    model: YOLO, static: ModelInfo, device: str, folder: Path, *, progress: Callable[[str], None] = print
) -> Iterator[Candidate | str]:
    """The pt2 package in FP32, and in what ``--half`` exports here (FP16 on CUDA, BF16 on a CPU with native BF16,
    where it is the fastest CPU backend: docs/inference.md): one compile per batch size, as export makes them (a
    fixed batch; a free one packs the CPU's convolution weights at every call). ``progress`` gets one line as the
    first compile is about to start."""
    from detector.exporting.pt2 import compiler_missing, export_pt2

    if (reason := compiler_missing()) is not None:
        yield f"pt2: skipped ({reason})"
        return
    half = half_precision(device)
    precisions = ("fp32",) if half == "fp32" else ("fp32", half)
    # Said once, just before the first build: the compiles print nothing of their own and are most of a CPU
    # benchmark's time (of ~2.5 minutes at 320 px on 2 cores).
    progress(f"pt2: compiling the {' and '.join(precisions)} packages, one per batch size (minutes on a small CPU; "
             "--skip pt2 leaves them out)")
    for precision in precisions:
        def build(batch: int, precision: str = precision) -> Backend:
            info = dataclasses.replace(static, precision=precision, batch=batch, batch_free=False)
            package = export_pt2(model, folder / f"{precision}-{batch}.pt2", info, device=device)
            return load_backend(package, device=device)

        yield Candidate(f"pt2 {precision}", per_batch(build))


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

    Every backend is built (and exported) and warmed up first, then timed in ``--rounds`` interleaved rounds
    (:func:`time_in_rounds`). ``progress`` gets a line per backend built, one before the pt2 compiles, and one per
    round with the running latencies (a run stopped by a time limit keeps those). So every backend is alive at once,
    at both batch sizes: the process's peak memory (a GPU's too) is the sum of theirs, where one after the other it was
    the largest.

    Raises:
        CheckpointError, FileNotFoundError, ValueError, Unavailable: one line naming the file or flag.
    """
    resolved = resolve_device(options.device)
    tune_process(resolved)  # before the first convolution: see detector/tuning.py
    device = str(resolved)
    weights = weights_or_latest(options.weights)
    notes: list[str] = []

    def failed(name: str, error: Exception) -> None:
        # One backend failing keeps the others' rows, whatever it raises: onnxruntime's own errors (Fail,
        # EPFail) are plain Exceptions, and a TensorRT release without an API we call raises AttributeError.
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        notes.append(f"{name}: failed ({type(error).__name__}: {reason})")
        progress(notes[-1])

    with tempfile.TemporaryDirectory(prefix="detector-benchmark-") as folder:
        if Path(weights).suffix == ".pt":
            candidates: Iterator[Candidate | str] = backends_for_checkpoint(
                Path(weights), imgsz=options.imgsz, device=device, folder=Path(folder), skip=skipped(options.skip),
                progress=progress, end_to_end=options.end_to_end,
            )
        else:  # an export made with --end-to-end runs its top-k with or without the flag; refused it without one
            single = load_backend(weights, device=device, nms=NMSConfig(end_to_end=options.end_to_end))
            candidates = iter([Candidate(single.name, lambda batch: single)])
            if not single.free_batch and single.info.batch != options.batch:  # a --dynamic pt2 package is free
                notes.append(fixed_batch_note(single.info.batch, options.batch))
        timed: list[Timed] = []
        for candidate in candidates:
            if isinstance(candidate, str):
                notes.append(candidate)
                continue
            try:
                timed.extend(prepare_candidate(candidate, options, device, progress))
            except Exception as error:  # noqa: BLE001 - reported in the table's notes, with its type
                failed(candidate.name, error)
        rounds = time_in_rounds(timed, rounds=options.rounds, device=device, failed=failed, progress=progress)
    rows = table_rows(timed, device)
    threads = torch.get_num_threads()
    header = (f"{weights} on {device} ({device_name(device)}, {threads} torch threads): ms per image at batch "
              f"{options.batch}, median of {options.runs} runs")
    if options.throughput_batch:
        header += f"; images/s at batch {options.throughput_batch}, median of {options.throughput_runs} runs"
    header += f"; the backends interleaved in {rounds} round{'s' if rounds > 1 else ''}"
    return header + "\n\n" + markdown_table(rows, notes, throughput_batch=options.throughput_batch)


def fixed_batch_note(fixed: int, asked: int) -> str:
    """The note for an export of a fixed batch timed at another: its calls run ``fixed`` images whatever is asked."""
    how = (f"a batch of {asked} is padded to {fixed}, so its latency is that of {fixed} images" if asked < fixed
           else f"a batch of {asked} runs in calls of {fixed}")
    return f"exported with a fixed batch of {fixed}: {how} (export with --dynamic, or --batch {asked}, to time {asked})"


def prepare_candidate(
    candidate: Candidate, options: BenchmarkOptions, device: str, progress: Callable[[str], None]
) -> list[Timed]:
    """``candidate`` built at ``--batch`` (and ``--throughput-batch`` when asked for) and warmed up: one
    :class:`Timed` each, their runs not taken yet."""
    plan = [(options.batch, options.runs, False)]
    if options.throughput_batch:
        plan.append((options.throughput_batch, options.throughput_runs, True))
    prepared = []
    for batch, runs, throughput in plan:
        backend = candidate.build(batch)
        size = options.imgsz if backend.info.dynamic and options.imgsz else backend.info.imgsz
        progress(f"built {backend.name} at {size} px, batch {batch}; warming up ...")
        images = sample_images(batch)
        time_runs(backend, images, size=size, runs=options.warmup, device=device)
        prepared.append(Timed(candidate.name, backend, images, size, runs, throughput))
    return prepared


def table_rows(timed: list[Timed], device: str) -> list[tuple[str, dict[str, float]]]:
    """One row per candidate, in the order built: its latency stages, and ``throughput`` (images/s) with the big
    batch's stages when measured (a candidate's latency entry comes before its throughput one). The name is the
    backend's own (ONNX Runtime names its GPU provider), with "on cpu" where it ran on the CPU though the table is for
    a GPU (a CPU-only onnxruntime build)."""
    rows: dict[str, tuple[str, dict[str, float]]] = {}
    for entry in timed:
        measured = entry.medians()
        if not entry.throughput:
            ran_on = getattr(entry.backend, "device", None)  # after the runs: the name says what ran (a failed graph)
            on_cpu = device.startswith("cuda") and ran_on is not None and torch.device(ran_on).type == "cpu"
            rows[entry.candidate] = (entry.backend.name + (" on cpu" if on_cpu else ""), measured)
        else:
            times = rows[entry.candidate][1]
            times["throughput"] = 1000 / sum(measured.values())
            times.update({f"batch {stage}": value for stage, value in measured.items()})
    return list(rows.values())
