"""Why a ``.pt`` file did not load, in one plain sentence: the loaders' (:mod:`detector.checkpoint`,
:mod:`detector.weights.safe_pickle`) words for torch's errors.

torch's own message depends on which of its readers tripped, not on what the file is: a text file read as a legacy
pickle gave ``Memo value not found at index 101``, a JPEG ``Unsupported operand 255``, which read like a refusal on
security grounds. The first bytes say what the file is, so they decide the sentence: ``torch.save`` writes a zip
(``PK\\x03\\x04``), or in its legacy format a pickle (protocol 2, ``\\x80\\x02``); anything else is no checkpoint at
all. A zip or a pickle that the ``weights_only`` reader refuses is still refused as such: that sentence names what
the file would have run (docs/security.md).
"""

from __future__ import annotations

import pickle
import re
import zipfile
from pathlib import Path

ZIP_START = b"PK\x03\x04"
PICKLE_START = b"\x80"  # the PROTO opcode that protocols 2 and later open with
NOT_A_CHECKPOINT = "not a PyTorch checkpoint"
# The readers a --weights file goes to (train, val and predict): what a file neither can read is said to be neither.
BOTH_READERS = "neither this project's nor Ultralytics' YOLOv8, YOLO11 or YOLO26 weights"
# What a file that is no checkpoint often is instead, by its first bytes: said, since it says what to do next.
LOOKS_LIKE = (
    (b"version https://git-lfs", "it is a Git LFS pointer, not the file itself: fetch it with git lfs pull"),
    (b"<!doctype html", "it is an HTML page: a download that fetched an error or login page?"),
    (b"<html", "it is an HTML page: a download that fetched an error or login page?"),
)
_BLOCKED_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")  # how torch's message names the refused global (2.6 to 2.14)


def file_start(path: str | Path, size: int = 32) -> bytes | None:
    """The first ``size`` bytes of ``path``; None when it cannot be read (torch's own error then stands)."""
    try:
        with open(path, "rb") as file:
            return file.read(size)
    except OSError:
        return None


def is_torch_file(start: bytes) -> bool:
    """``start`` opens a file of the kind ``torch.save`` writes: its zip or its legacy pickle."""
    return start.startswith(ZIP_START) or start.startswith(PICKLE_START)


def not_a_checkpoint(start: bytes, *, which: str = "") -> str:
    """``not a PyTorch checkpoint``, then ``which`` (the readers that tried) in parentheses, then what the file is
    where its first bytes tell."""
    lowered = start.lower()
    looks = next((says for prefix, says in LOOKS_LIKE if lowered.startswith(prefix)), "")
    return NOT_A_CHECKPOINT + (f" ({which})" if which else "") + (f"; {looks}" if looks else "")


def start_problem(start: bytes) -> str | None:
    """What a file that opens with ``start`` is, where its first bytes alone say it is no checkpoint (empty, or not
    the zip or pickle ``torch.save`` writes); None when it may be one."""
    if start == b"":
        return f"empty or cut short (0 bytes), {NOT_A_CHECKPOINT}"
    return None if is_torch_file(start) else not_a_checkpoint(start)


def is_refusal(error: BaseException) -> bool:
    """torch's ``weights_only`` reader refused the pickle's content (a global, an opcode), as opposed to failing to
    read the file."""
    return isinstance(error, pickle.UnpicklingError) and "weights only" in str(error).lower()


def zip_problem(path: str | Path) -> str | None:
    """What is wrong with a file that opens as a zip, where the archive itself says; None when it looks whole and
    holds a pickle (torch's error then says more)."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):  # no end of archive: cut short or overwritten
        return "a damaged PyTorch checkpoint: cut short or corrupt (its zip archive cannot be read)"
    if not any(name.endswith("data.pkl") for name in names):  # torch.save's zip holds <name>/data.pkl
        return f"a zip archive, {NOT_A_CHECKPOINT}"
    return None


# What torch.jit.save writes beside data.pkl: torch.load hands such a zip to torch.jit.load, which runs the code it
# holds, and first warns advising to call torch.jit.load directly.
TORCHSCRIPT_MEMBER = "constants.pkl"
TORCHSCRIPT = ("refused: a TorchScript archive (torch.jit.save), whose loading would run the code it holds; "
               "checkpoints are read as tensors and plain values only")


def torchscript_problem(path: str | Path) -> str | None:
    """:data:`TORCHSCRIPT` where ``path`` is a zip holding a TorchScript archive's ``constants.pkl``, told from its
    member names before torch opens it; None otherwise, or when it is no readable zip (the loader's error says so)."""
    try:
        if not zipfile.is_zipfile(path):
            return None
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        return None
    return TORCHSCRIPT if any(Path(name).name == TORCHSCRIPT_MEMBER for name in names) else None


def load_problem(error: BaseException, path: str | Path | None = None) -> str:
    """What ``error``, raised by ``torch.load(path)``, says about the file, in our words: never torch's advice to
    retry with ``weights_only=False`` (which would run the code a malicious file carries), and one sentence at most.

    ``path``: the file, whose first bytes tell a file that is no checkpoint at all from a damaged or refused one.
    """
    start = file_start(path) if path is not None else None
    text = str(error)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if start is not None and (problem := start_problem(start)) is not None:
        return problem
    if is_refusal(error):
        if (match := _BLOCKED_GLOBAL.search(text)) and match.group(1).startswith("ultralytics."):
            # Not said as a refusal on security grounds: the weights of such a file are read, by --weights.
            return (f"an Ultralytics checkpoint (it names {match.group(1)}): its weights are read with --weights "
                    f"{path or 'FILE'} (train starts a fine-tune from them; val, predict and export take them), but "
                    "an Ultralytics run cannot be resumed here")
        if match:
            return (f"refused: it names the Python global {match.group(1)}, which loading would import and run; "
                    "checkpoints are read as tensors and plain values only")
        advice = ("weights_only", "Weights only", "documentation", "file an issue")
        detail = next((line for line in lines if not any(word in line for word in advice)), "")
        return f"refused: not plain tensors and values ({detail or 'unsupported pickle content'})"
    if path is not None and start is not None and start.startswith(ZIP_START) and (problem := zip_problem(path)):
        return problem
    if isinstance(error, EOFError) or not lines or "truncated" in text:  # torch's words add nothing to these
        return "a damaged PyTorch checkpoint: cut short"
    return f"not a loadable PyTorch checkpoint ({lines[0].split('. ')[0][:200]})"
