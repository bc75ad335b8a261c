"""The workflows' option dataclasses: the free-text flags they check as they are made (the checks every option
object shares: tests/test_options.py)."""

from __future__ import annotations

import pytest

from detector.workflows.options import BenchmarkOptions, ExportOptions, parse_formats, skipped


def test_formats_are_case_free_deduplicated_and_checked() -> None:
    assert parse_formats("onnx") == ["onnx"]
    assert parse_formats("ENGINE, onnx,engine") == ["engine", "onnx"]
    for text in ("pdf", "", ","):
        with pytest.raises(ValueError, match="--format .*: choose from onnx, engine"):
            parse_formats(text)
    with pytest.raises(ValueError, match="--format 'pdf'"):
        ExportOptions(format="pdf")
    # Ultralytics' other formats: what to do instead, in one line.
    with pytest.raises(ValueError, match=r"^--format torchscript: TorchScript is deprecated .*--format pt2"):
        parse_formats("onnx,TorchScript")
    with pytest.raises(ValueError, match=r"^--format openvino: not built here: --format onnx, then convert"):
        ExportOptions(format="openvino")


def test_skip_names_backends_and_refuses_others() -> None:
    assert skipped("PT2, onnx") == {"pt2", "onnx"} and skipped("") == set()
    with pytest.raises(ValueError, match="--skip 'tflite': choose from pytorch, onnx, pt2, engine"):
        BenchmarkOptions(skip="tflite")
