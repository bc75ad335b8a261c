"""The loop profile: its GPU-busy arithmetic (the union of kernel intervals, overlaps counted once) and its marks."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))  # the script imports its neighbour checkout.py

from benchmarks.loop_profile import MARKED, PARTS, union_ms  # noqa: E402


def test_overlapping_kernels_count_once_and_gaps_not_at_all():
    # microseconds: [0, 1000] and [500, 1500] overlap (1.5 ms), [1200, 1300] lies inside, [3000, 3500] after a gap
    assert union_ms([(3000, 3500), (0, 1000), (1200, 1300), (500, 1500)]) == 2.0
    assert union_ms([]) == 0.0


def test_every_marked_part_is_still_a_function_of_its_module():
    # A renamed or inlined function would stop the profile at start (it did once, on a GPU lease).
    for module, name, part in MARKED:
        assert callable(getattr(module, name, None)), f"{module.__name__}.{name}"
        assert part in PARTS
