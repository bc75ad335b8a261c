"""How every command ends: :func:`run_command` turns the errors a user can act on into one line and an exit code.

The codes are documented in :mod:`detector.cli` (0 ok, 1 failed on its input, 2 usage, 130 interrupted, 143
terminated).
"""

from __future__ import annotations

import functools
import gc
import os
import pickle
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from detector.cli import FAILED, INTERRUPTED, OK, TERMINATED
from detector.signals import Terminated


class CommandFailed(Exception):
    """A step of a command failed and has said why already (ablate-amp's training runs print their own error)."""


@contextmanager
def uncollected_imports() -> Iterator[None]:
    """Run the block (a command's first, heavy imports) without Python's cyclic garbage collector, then freeze
    every object alive (``gc.freeze``) so that later collections skip them; the collector's state is restored.

    Importing torch, torchvision and ``torch._dynamo`` created ~540k objects that live as long as the process. The
    collector's thresholds made it run 5 full passes and ~800 young ones over them while they were being created:
    0.6 s of the 4.2-4.4 s these imports took on a 2-core AMD EPYC (docs/training-log.md, 2026-11-26); the
    commands now import torch here, and training ``torch._dynamo`` too (detector/cli/train.py). Frozen, they cost no
    later pass either, and the loader workers forked from this process do not copy the pages the collector would
    have written to.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


@functools.cache
def user_errors() -> tuple[type[BaseException], ...]:
    """What a user can act on: a file, a flag value, a dataset, a download, a diverged run, a failed export check,
    a batch too large for the GPU. Each is raised with a message that names the file or the flag, so the message
    is all the user needs; anything else (a RuntimeError from inside torch included) is a bug and keeps its
    traceback. Imported here, when a command runs, not when its module loads: ``--help`` never imports torch.
    These are every command's heaviest imports (torch, and our modules through the export wrapper), so they run
    once per process without the garbage collector (:func:`uncollected_imports`)."""
    with uncollected_imports():
        import torch

        from detector.checkpoint import CheckpointError
        from detector.data.transfer import DownloadError
        from detector.data.spec import DatasetError
        from detector.distributed import DistributedSetupError
        from detector.exporting import ExportError
        from detector.extras import MissingExtra, Unavailable

    return (
        CheckpointError,
        CommandFailed,
        DatasetError,
        DistributedSetupError,  # more CUDA processes on a node than GPUs: the line says what to run instead
        DownloadError,
        ExportError,  # TensorRT refused the graph, or the export failed its parity check
        FloatingPointError,
        MissingExtra,  # an optional package: the line names the extra that installs it
        OSError,  # a file not found, not writable, a full disk: Python's message names the file
        Unavailable,  # TensorRT with a CUDA GPU, or a C++ compiler, that this machine lacks
        ValueError,
        pickle.UnpicklingError,
        torch.cuda.OutOfMemoryError,  # torch's message says how much it tried to allocate; a smaller --batch helps
    )


def one_line(error: BaseException) -> str:
    """The message on one line (a library's message may span several), else the error's name."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return "; ".join(lines) or type(error).__name__


def plain_warning(message: Warning | str, category: type[Warning], *_: object) -> str:
    """A warning as a command prints it: ``warning: <message>``, without Python's file, line and source line
    (a dataset's warning names its own files)."""
    return f"warning: {message}\n"


def one_process(command: str) -> int | None:
    """None where the command runs alone; under torchrun (``WORLD_SIZE`` above 1) the exit code of a refusal: the
    first process says why in one line, the others leave quietly. Each process ran the whole command and they
    wrote ``runs/val/exp`` and ``exp2``, their tables interleaved; only training divides its work among them."""
    import os

    if int(os.environ.get("WORLD_SIZE", "1") or 1) <= 1:
        return None
    if int(os.environ.get("RANK", "0") or 0) == 0:
        print(f"error: {command} runs in one process: start it with python (or detector {command}), not torchrun; "
              "only train shares its work among processes", file=sys.stderr)
    return FAILED


# How long a torchrun process other than its node's first waits before printing a user error. Such an error (a
# missing --data) is met by every rank at once: the first prints it and exits, torchrun sees that within its
# monitor interval (0.1 s) and ends the others with SIGTERM while they wait here, so the line is printed once per
# node, not once per process. 10 s covers the first's exit many times over (from its line to torchrun's SIGTERM:
# 0.3-0.5 s measured on 2 CPU ranks, torch 2.14); a rank-specific error (one GPU's out-of-memory) prints that much
# later, naming its rank. Should the first wait at exit for the others (an NCCL group's teardown), it is two lines
# after 10 s, as before.
PEER_ERROR_WAIT_S = 10.0


def node_peer() -> int | None:
    """This process's rank under torchrun when it is not its node's first process (``LOCAL_RANK`` above 0), else
    None. Only under torchrun's agent (``TORCHELASTIC_RUN_ID``), which ends a failed job's other processes: another
    launcher that sets ``LOCAL_RANK`` (an srun recipe) kills none, and each of its processes would wait for nothing."""
    if ("TORCHELASTIC_RUN_ID" not in os.environ or int(os.environ.get("WORLD_SIZE", "1") or 1) <= 1
            or int(os.environ.get("LOCAL_RANK", "0") or 0) == 0):
        return None
    return int(os.environ.get("RANK", "0") or 0)


def run_command(function: Callable[..., object], *args: object) -> int:
    """Call ``function(*args)``; -> the exit code. A user error prints ``error: ...`` on stderr (1), Ctrl-C
    ``error: interrupted`` or the interrupt's own message, such as download's how-to-resume (130; 143 for a
    :class:`Terminated`). Warnings
    print as ``warning: ...`` lines (:func:`plain_warning`)."""
    warnings.formatwarning = plain_warning
    try:
        errors = user_errors()  # imports torch: a Ctrl-C in the first second or two lands here
    except KeyboardInterrupt:
        print("\nerror: interrupted", file=sys.stderr)
        return INTERRUPTED
    try:
        function(*args)
    except errors as error:
        rank = node_peer()
        if rank is not None:
            try:
                time.sleep(PEER_ERROR_WAIT_S)  # torchrun ends this process here when the node's first failed alike
            except KeyboardInterrupt:  # a Ctrl-C in the wait: the error's line all the same, not a traceback
                pass
        print(f"error: {'' if rank is None else f'rank {rank}: '}{one_line(error)}", file=sys.stderr)
        return FAILED
    except KeyboardInterrupt as interrupt:
        # The newline ends the line the terminal echoed ^C on (or a progress bar), so the message stands alone.
        print(f"\nerror: {one_line(interrupt) if str(interrupt) else 'interrupted'}", file=sys.stderr)
        return TERMINATED if isinstance(interrupt, Terminated) else INTERRUPTED
    return OK
