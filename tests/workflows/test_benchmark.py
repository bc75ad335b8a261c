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
    """A pt2 compile, an engine build or an ONNX Runtime session that fails on the machine's tools no longer throws
    away the rows already timed: the table keeps them and says which backend failed and why, in one line; each
    row was printed as soon as it was measured (a run cut short by a time limit keeps them)."""
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
    row = next(line for line in table.splitlines() if line.startswith("| pytorch fp32 |"))
    assert row in printed and printed.index(row) < len(printed) - 1  # printed before the failing backend's note
    assert f"pt2 fp16: failed ({type(raised).__name__}: {str(raised)})" in table


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
