"""train_speed.py's step-alone column follows the runs' --extra flags where they change the step."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))  # the script imports its neighbours

from benchmarks.train_speed import recompute_asked  # noqa: E402


def test_the_step_alone_recomputes_as_the_runs_extra_flags_say():
    assert recompute_asked([]) is None and recompute_asked(["--recompute=auto"]) is None  # the trainer's default
    assert recompute_asked(["--no-multi-scale", "--recompute", "off"]) is False
    assert recompute_asked(["--recompute=on"]) is True
