"""Whether a checkpoint's contents are sound (detector/checkpoint_integrity.py): finite weights, zip parts that match
their checksums."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from detector.checkpoint_integrity import damage, peak_magnitudes


def test_peaks_carry_nan_and_inf_and_are_zero_when_empty() -> None:
    peaks = peak_magnitudes([torch.tensor([1.0, -3.0]), torch.tensor([float("nan"), 1.0]), torch.tensor([-math.inf]),
                             torch.zeros(0), torch.tensor([1e300], dtype=torch.float64)])
    assert peaks[0] == 3.0 and math.isnan(peaks[1]) and peaks[2] == math.inf and peaks[3] == 0.0
    assert peaks[4] == 1e300  # float64 all the way: a float64 weight's peak stays finite


def test_damage_names_a_part_that_fails_its_checksum_and_weights_that_are_not_finite(tmp_path: Path) -> None:
    path = tmp_path / "last.pt"
    weights = {"w": torch.arange(64, dtype=torch.float32)}
    torch.save({"model": weights}, path)
    assert damage(path, {"model": weights}) is None
    assert damage(path, {"model": {"w": torch.tensor([math.nan])}}) == "its 'model' weights are not finite"
    data = bytearray(path.read_bytes())
    start = data.index(torch.arange(64, dtype=torch.float32).numpy().tobytes())  # the stored tensor's bytes
    data[start + 10] ^= 0xFF
    path.write_bytes(bytes(data))
    reason = damage(path, {"model": weights})
    assert reason is not None and reason.startswith("its part ") and reason.endswith("does not match its checksum")
