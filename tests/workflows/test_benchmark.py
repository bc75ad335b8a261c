"""The benchmark workflow's helpers (the command end to end: tests/cli/test_predict_and_benchmark.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from detector.workflows.benchmark import device_name, markdown_table, sample_images


def test_sample_images_are_deterministic_4_3_frames() -> None:
    first, again = sample_images(2), sample_images(2)
    assert [image.shape for image in first] == [(480, 640, 3)] * 2 and first[0].dtype == np.uint8
    assert all(np.array_equal(a, b) for a, b in zip(first, again))


def test_the_table_has_a_row_per_backend_and_the_skip_notes() -> None:
    times = {"pre-process": 1.0, "inference": 2.0, "post-process": 0.5}
    table = markdown_table([("pytorch fp32", times)], ["tensorrt: skipped (no GPU)"])
    assert "| pytorch fp32 | 1.00 | 2.00 | 0.50 | 3.50 |" in table.splitlines()
    assert table.endswith("\ntensorrt: skipped (no GPU)")


def test_the_throughput_column_is_images_per_second_at_the_big_batch() -> None:
    fast = {"pre-process": 1.0, "inference": 2.0, "post-process": 0.5, "throughput": 512.25,
            "batch pre-process": 0.5, "batch inference": 1.0, "batch post-process": 0.4521}
    slow = {"pre-process": 1.0, "inference": 2.0, "post-process": 0.5}  # no throughput measured
    table = markdown_table([("pt2 fp32", fast), ("onnxruntime fp32", slow)], [], throughput_batch=32).splitlines()
    assert table[0].endswith("| total ms | batch-32 images/s | batch-32 pre / inference / post ms |")
    assert "| pt2 fp32 | 1.00 | 2.00 | 0.50 | 3.50 | 512.2 | 0.500 / 1.000 / 0.452 |" in table
    assert "| onnxruntime fp32 | 1.00 | 2.00 | 0.50 | 3.50 | - | - |" in table


def test_the_device_has_a_name() -> None:
    assert device_name("cpu").strip()
    if torch.cuda.is_available():
        assert device_name("cuda") == torch.cuda.get_device_name(0)


class Fail(Exception):
    """As onnxruntime's own errors (onnxruntime.capi.onnxruntime_pybind11_state.Fail): a plain Exception."""


@pytest.mark.parametrize("error", ["export", "onnxruntime"])
def test_a_backend_that_fails_leaves_a_note_and_the_other_rows(monkeypatch, checkpoint, error) -> None:
    """A pt2 compile, an engine build or an ONNX Runtime session that fails on the machine's tools throws away no
    other backend's row: the table keeps them and says which backend failed and why, in one line, as the progress
    lines do; each round's line gives the running latencies (a run cut short by a time limit keeps them)."""
    import detector.workflows.benchmark as benchmark
    from detector.exporting import ExportError
    from detector.workflows.options import BenchmarkOptions

    real = benchmark.backends_for_checkpoint
    raised = (ExportError("best.pt2: the pt2 compile failed: cuda.h: No such file or directory") if error == "export"
              else Fail("[ONNXRuntimeError] : 1 : FAIL : CUDA failure 100: no CUDA-capable device is detected"))

    def with_a_broken_one(*args, **kwargs):
        for candidate in real(*args, **kwargs):
            yield candidate
            if isinstance(candidate, benchmark.Candidate) and candidate.name.startswith("pytorch"):
                def build(batch: int):
                    raise raised
                yield benchmark.Candidate("pt2 fp16", build)

    monkeypatch.setattr(benchmark, "backends_for_checkpoint", with_a_broken_one)
    printed: list[str] = []
    table = benchmark.run_benchmark(BenchmarkOptions(weights=str(checkpoint), imgsz=64, runs=1, warmup=0,
                                                     throughput_batch=0, skip="onnx,pt2,engine", device="cpu"),
                                    progress=printed.append)
    assert any(line.startswith("| pytorch fp32 |") for line in table.splitlines())
    note = f"pt2 fp16: failed ({type(raised).__name__}: {str(raised)})"
    assert note in table and note in printed
    assert any(line.startswith("round 1/1: pytorch fp32 ") for line in printed)  # one run: one round
    assert table.splitlines()[0].endswith("; the backends interleaved in 1 round")


def timed_entries(names: list[str], runs: int) -> list:
    from detector.workflows.benchmark import Timed

    return [Timed(name, None, [], 64, runs, throughput=False) for name in names]


def record_runs(monkeypatch, calls: list, fail: dict | None = None) -> list:
    """benchmark.time_runs replaced by a recorder: which backend ran how many batches, in order (each batch's
    stages 1 ms); ``fail``: backend -> the call at which it raises. -> the list of entries it times, for the caller
    to fill."""
    import detector.workflows.benchmark as benchmark

    def recorded(backend, images, *, size, runs, device, into):
        name = next(entry for entry in entries if entry.stages is into).candidate
        calls.append((name, runs))
        if fail and fail.get(name) == sum(1 for called, _ in calls if called == name):
            raise Fail(f"{name} broke")
        for stage in benchmark.STAGES:
            into[stage].extend([1.0] * runs)
        return into

    entries: list = []
    monkeypatch.setattr(benchmark, "time_runs", recorded)
    return entries


def test_backends_are_timed_in_interleaved_rounds_that_share_out_the_runs(monkeypatch) -> None:
    """A machine's drift over minutes (10-25% on a shared CPU) must slow every backend alike: each round gives every
    backend its share of the runs in turn, and the shares add up to --runs."""
    from detector.workflows.benchmark import round_shares, time_in_rounds

    assert round_shares(7, 3) == [3, 2, 2] and round_shares(20, 5) == [4] * 5 and sum(round_shares(2, 5)) == 2
    calls: list = []
    entries = record_runs(monkeypatch, calls)
    entries += timed_entries(["a", "b"], runs=5)
    printed: list[str] = []
    assert time_in_rounds(entries, rounds=2, device="cpu", failed=lambda name, error: None,
                          progress=printed.append) == 2
    assert calls == [("a", 3), ("b", 3), ("a", 2), ("b", 2)]
    assert [len(entry.stages["inference"]) for entry in entries] == [5, 5]
    assert printed == ["round 1/2: a 3.00 ms, b 3.00 ms", "round 2/2: a 3.00 ms, b 3.00 ms"]


def test_a_backend_that_fails_in_a_round_leaves_the_rounds_and_the_others_go_on(monkeypatch) -> None:
    from detector.workflows.benchmark import time_in_rounds

    calls: list = []
    entries = record_runs(monkeypatch, calls, fail={"a": 2})
    entries += timed_entries(["a", "b"], runs=3)
    failures: list = []
    time_in_rounds(entries, rounds=3, device="cpu", failed=lambda name, error: failures.append((name, str(error))),
                   progress=lambda line: None)
    assert calls == [("a", 1), ("b", 1), ("a", 1), ("b", 1), ("b", 1)]
    assert failures == [("a", "a broke")] and [entry.candidate for entry in entries] == ["b"]


@pytest.mark.parametrize("flag", ["runs", "throughput_runs", "rounds"])
def test_a_count_below_one_is_refused_naming_its_flag(flag) -> None:
    from detector.workflows.options import BenchmarkOptions

    with pytest.raises(ValueError, match=f"--{flag.replace('_', '-')} must be at least 1; got 0"):
        BenchmarkOptions(**{flag: 0})


@pytest.mark.parametrize(("half", "expected"), [("fp32", ["pt2 fp32"]), ("bf16", ["pt2 fp32", "pt2 bf16"]),
                                                 ("fp16", ["pt2 fp32", "pt2 fp16"])])
def test_pt2_is_timed_in_fp32_and_in_what_half_exports_here(monkeypatch, tmp_path, half, expected) -> None:
    """A CPU with native BF16 times its BF16 package too (the fastest CPU backend there); nothing compiles until a
    candidate is built."""
    import detector.exporting.pt2 as pt2
    import detector.workflows.benchmark as benchmark

    monkeypatch.setattr(pt2, "compiler_missing", lambda: None)
    monkeypatch.setattr(benchmark, "half_precision", lambda device: half)
    names = [candidate.name for candidate in benchmark.pt2_candidates(None, None, "cpu", tmp_path)]
    assert names == expected


@pytest.mark.parametrize("skip", ["onnx,engine", "onnx,pt2,engine"])
def test_a_line_says_the_pt2_compiles_take_minutes_before_they_start(monkeypatch, checkpoint, skip) -> None:
    """The compiles are most of a CPU benchmark's time (~2.5 minutes at 320 px on 2 cores) and print nothing of
    their own: one progress line before the first says so, and how to leave them out; none with --skip pt2. The
    export here is a stand-in that fails at once (the table notes it), so nothing compiles."""
    import detector.exporting.pt2 as pt2
    import detector.workflows.benchmark as benchmark
    from detector.workflows.options import BenchmarkOptions

    printed: list[str] = []

    def export_pt2(*args, **kwargs):
        printed.append("export_pt2 called")
        raise RuntimeError("no compile in this test")

    monkeypatch.setattr(pt2, "compiler_missing", lambda: None)
    monkeypatch.setattr(pt2, "export_pt2", export_pt2)
    monkeypatch.setattr(benchmark, "half_precision", lambda device: "bf16")  # two packages, as on a CPU with BF16
    benchmark.run_benchmark(BenchmarkOptions(weights=str(checkpoint), imgsz=64, runs=1, warmup=0, throughput_batch=0,
                                             skip=skip, device="cpu"), progress=printed.append)
    line = ("pt2: compiling the fp32 and bf16 packages, one per batch size (minutes on a small CPU; --skip pt2 leaves "
            "them out)")
    if "pt2" in skip:
        assert not [entry for entry in printed if entry.startswith("pt2")] and "export_pt2 called" not in printed
    else:
        assert printed.count(line) == 1 and printed.index(line) < printed.index("export_pt2 called")


def test_a_cpu_table_builds_no_tensorrt_engine_even_where_tensorrt_could(monkeypatch, checkpoint, tmp_path) -> None:
    """A host with a GPU and TensorRT, benchmarked with --device cpu: an engine (GPU-only) is no row of the CPU's
    table, so none is built (it would be, on the GPU, once per batch size and precision); the table says why."""
    import detector.workflows.benchmark as benchmark

    monkeypatch.setattr(benchmark, "tensorrt_missing", lambda: None)  # as if TensorRT and a GPU were here
    monkeypatch.setattr(benchmark, "build_engine", lambda *args, **kwargs: pytest.fail("built an engine"))
    found = list(benchmark.backends_for_checkpoint(checkpoint, imgsz=64, device="cpu", folder=tmp_path,
                                                   skip={"pytorch", "onnx", "pt2"}))
    assert found == ["tensorrt: skipped (engines run on a CUDA GPU; this table is cpu's)"]


def test_an_export_of_a_fixed_batch_says_what_its_latency_is() -> None:
    """A --batch 4 export timed at batch 1 was labelled "ms per image at batch 1" while each call ran 4 images."""
    from detector.workflows.benchmark import fixed_batch_note

    assert fixed_batch_note(4, 1) == ("exported with a fixed batch of 4: a batch of 1 is padded to 4, so its latency "
                                      "is that of 4 images (export with --dynamic, or --batch 1, to time 1)")
    assert "a batch of 32 runs in calls of 4" in fixed_batch_note(4, 32)


def test_ultralytics_weights_are_timed_as_val_and_predict_read_them(tmp_path) -> None:
    """``benchmark model=yolov8n.pt`` refused Ultralytics' file as a hostile pickle: it read only our checkpoints."""
    from detector.workflows.benchmark import run_benchmark
    from detector.workflows.options import BenchmarkOptions
    from tests.weights.lookalike import yolov8_lookalike_bytes

    weights = tmp_path / "yolov8n.pt"
    weights.write_bytes(yolov8_lookalike_bytes("n", num_classes=3))
    table = run_benchmark(BenchmarkOptions(weights=str(weights), imgsz=64, runs=1, warmup=0, throughput_batch=0,
                                           skip="onnx,pt2,engine", device="cpu"), progress=lambda line: None)
    assert any(line.startswith("| pytorch fp32 |") for line in table.splitlines())
