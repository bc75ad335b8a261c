"""The Ctrl-C/SIGTERM handler of a run (detector/training/interrupt.py)."""

from __future__ import annotations

import contextlib
import io
import os
import signal

from detector.training.interrupt import CtrlC


def test_the_line_reaches_the_runs_stdout_even_while_the_evaluation_redirects_it(capsys) -> None:
    """pycocotools' evaluation runs with stdout redirected into a buffer that is thrown away; a SIGTERM landing
    there set the stop but its line went into that buffer (a CI run saw "interrupted: saved" with no line)."""
    ctrl_c = CtrlC(single_process=True, announce=True)
    ctrl_c.install()
    try:
        discarded = io.StringIO()
        with contextlib.redirect_stdout(discarded):
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs in this thread before kill returns to Python
    finally:
        ctrl_c.restore()
    assert ctrl_c.requested
    assert "finishing this epoch" not in discarded.getvalue()
    assert "SIGTERM: finishing this epoch" in capsys.readouterr().out
