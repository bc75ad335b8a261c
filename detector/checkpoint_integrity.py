"""Whether a checkpoint's contents are sound: its weights finite, its zip parts matching their checksums.

Kept apart from :mod:`detector.checkpoint` (writing, loading, stripping): these read tensors and files that are
already in hand, and say what is wrong in a few words the callers put into their own line.
"""

from __future__ import annotations

import math
import zipfile
from pathlib import Path
from typing import Any

import torch


def peak_magnitudes(tensors: list[torch.Tensor]) -> list[float]:
    """The largest absolute value of each tensor (NaN where it holds a NaN, inf where an inf; 0.0 when empty), read
    back to the host once for all of them. Checking tensor by tensor synchronised each one: the finiteness check of
    an 80-class nano model's weights took 15-17 ms on a 2-core Xeon, against 7-8 ms (benchmarks/checkpoint_speed.py)."""
    peaks = [t.detach().abs().amax() if t.numel() else t.new_zeros(()) for t in tensors]  # amax propagates NaN
    if len({peak.device for peak in peaks}) != 1:  # none, or a state dict across devices: one sync each
        return [float(peak) for peak in peaks]
    return torch.stack([peak.double() for peak in peaks]).tolist()  # float64: a float64 weight's peak stays finite


def all_finite(state_dict: dict[str, torch.Tensor]) -> bool:
    floats = [t for t in state_dict.values() if t.is_floating_point()]
    return all(math.isfinite(peak) for peak in peak_magnitudes(floats))


def non_finite_weights(checkpoint: dict[str, Any]) -> str | None:
    """``"model"`` or ``"ema"``, the first of a checkpoint's weights that are not finite; None when both are."""
    found = [k for k in ("model", "ema") if isinstance(checkpoint.get(k), dict) and not all_finite(checkpoint[k])]
    return found[0] if found else None


def damage(path: Path, checkpoint: dict[str, Any]) -> str | None:
    """What is wrong with a run checkpoint that loaded (None: nothing found), checked at resume: a part failing its zip
    CRC (torch does not check them: a flipped bit loads, and trained an epoch on NaN weights), or non-finite weights."""
    if zipfile.is_zipfile(path):  # torch.save's format since 1.6; reading it again costs ~0.1 s for 50 MB
        with zipfile.ZipFile(path) as bundle:
            if (bad := bundle.testzip()) is not None:
                return f"its part {bad} does not match its checksum"
    return f"its '{key}' weights are not finite" if (key := non_finite_weights(checkpoint)) else None
