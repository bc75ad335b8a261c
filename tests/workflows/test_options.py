"""The workflows' option dataclasses: the free-text flags they check as they are made (the checks every option
object shares: tests/test_options.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from detector.workflows.options import (
    BenchmarkOptions,
    ExportOptions,
    PredictOptions,
    ValOptions,
    parse_formats,
    skipped,
)


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


@pytest.mark.parametrize("options_class", [PredictOptions, ValOptions, ExportOptions])
@pytest.mark.parametrize(("flags", "message"), [
    ({"conf": 25.0}, "--conf must be between 0 and 1; got 25.0"),  # meant 0.25: no box would pass, said nothing
    ({"iou": -0.1}, "--iou must be between 0 and 1; got -0.1"),
    ({"max_det": 0}, "--max-det must be at least 1; got 0"),
    ({"imgsz": 0}, "--imgsz must be at least 1; got 0"),
])
def test_detection_flags_out_of_range_are_one_line(options_class: type, flags: dict, message: str) -> None:
    required = {PredictOptions: {"source": "x.jpg"}, ValOptions: {"weights": Path("best.pt")}}.get(options_class, {})
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        options_class(**required, **flags)
    options_class(**required, conf=0.0, iou=1.0, max_det=1)  # the edges are values


@pytest.mark.parametrize(("options_class", "flags", "message"), [
    (ValOptions, {"batch": 0}, "--batch must be at least 1; got 0"),  # was "range() arg 3 must not be zero"
    (ValOptions, {"workers": -3}, "--workers must be at least 0; got -3"),  # was torch's DataLoader message
    (BenchmarkOptions, {"batch": 0}, "--batch must be at least 1; got 0"),  # each backend "failed" at run time
    (BenchmarkOptions, {"throughput_batch": -1}, "--throughput-batch must be at least 0; got -1"),
    (ExportOptions, {"workers": -1}, "--workers must be at least 0; got -1"),
])
def test_counts_below_their_least_are_one_line(options_class: type, flags: dict, message: str) -> None:
    required = {ValOptions: {"weights": Path("best.pt")}}.get(options_class, {})
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        options_class(**required, **flags)


@pytest.mark.parametrize("source", ["", "  "])
def test_an_empty_source_is_one_line(source: str) -> None:
    """``--source ''`` read every image under the working folder (Path("") is ".")."""
    with pytest.raises(ValueError, match=r"^--source is empty"):
        PredictOptions(source=source)
