"""The export workflow's helpers (the command end to end: tests/cli/test_export.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("onnx", reason="the export workflow writes ONNX (the 'export' extra)")

from detector.workflows.export import parse_formats  # noqa: E402  (after the skip: it imports onnx)


def test_formats_are_case_free_deduplicated_and_checked() -> None:
    assert parse_formats("onnx") == ["onnx"]
    assert parse_formats("ENGINE, onnx,engine") == ["engine", "onnx"]
    for text in ("tflite", "", ","):
        with pytest.raises(ValueError, match="--format .*: choose from onnx, engine"):
            parse_formats(text)
