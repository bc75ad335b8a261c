"""Forked children of a training run (detector/forked.py): SIGTERM from the parent alone."""

import multiprocessing
import os
import signal
import subprocess
import time

import pytest

from detector.forked import end_at_parents_sigterm_only


def _child(ready) -> None:  # module level: the fork context's target
    end_at_parents_sigterm_only(os.getppid())
    ready.set()
    time.sleep(60)


@pytest.mark.skipif(not hasattr(signal, "sigwaitinfo") or "fork" not in multiprocessing.get_all_start_methods(),
                    reason="no sigwaitinfo or fork here: SIGTERM keeps its default")
def test_a_child_ends_at_its_parents_sigterm_and_not_at_anyone_elses(watchdog) -> None:
    """torchrun and SLURM send SIGTERM to every process of a rank's group: a loader worker that died of it took the
    trainer down before it could save last.pt. Its parent's SIGTERM (multiprocessing's at exit) must still end it."""
    context = multiprocessing.get_context("fork")
    ready = context.Event()
    child = context.Process(target=_child, args=(ready,), daemon=True)
    child.start()
    try:
        assert ready.wait(30)
        subprocess.run(["kill", "-TERM", str(child.pid)], check=True)  # another sender, as torchrun or SLURM
        child.join(1.0)
        assert child.is_alive(), f"died of another process's SIGTERM (exit code {child.exitcode})"
        os.kill(child.pid, signal.SIGTERM)  # the parent's, as multiprocessing ends its children at exit
        child.join(10.0)
        assert not child.is_alive() and child.exitcode == 0, child.exitcode
    finally:
        if child.is_alive():
            child.kill()
            child.join()
