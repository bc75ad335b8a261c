"""The benchmark workflow's helpers (the command end to end: tests/cli/test_predict_and_benchmark.py)."""

from __future__ import annotations

import numpy as np

from detector.workflows.benchmark import markdown_table, sample_images


def test_sample_images_are_deterministic_4_3_frames() -> None:
    first, again = sample_images(2), sample_images(2)
    assert [image.shape for image in first] == [(480, 640, 3)] * 2 and first[0].dtype == np.uint8
    assert all(np.array_equal(a, b) for a, b in zip(first, again))


def test_the_table_has_a_row_per_backend_and_the_skip_notes() -> None:
    times = {"pre-process": 1.0, "inference": 2.0, "post-process": 0.5}
    table = markdown_table([("pytorch fp32", times)], ["tensorrt: skipped (no GPU)"])
    assert "| pytorch fp32 | 1.00 | 2.00 | 0.50 | 3.50 |" in table.splitlines()
    assert table.endswith("\ntensorrt: skipped (no GPU)")
