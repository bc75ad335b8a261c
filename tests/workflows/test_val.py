"""The val workflow's helpers (the command end to end: tests/cli/test_val.py)."""

from __future__ import annotations

import pytest

from detector.workflows.val import resolve_image_size


def test_image_size_resolution() -> None:
    assert resolve_image_size(None, {"imgsz": 320}) == 320
    assert resolve_image_size(None, None) == 640
    with pytest.raises(ValueError, match=r"must be a positive multiple of 32 \(got 100\); try 96"):
        resolve_image_size(100, {"imgsz": 320})  # refused, as training refuses it
