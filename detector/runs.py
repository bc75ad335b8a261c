"""Run folders, claimed atomically, and the per-epoch ``results.csv``."""

from __future__ import annotations

import csv
import io
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from detector.files import write_text_atomically


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a run folder under ``--project``, in one line; None when it can. ``a/b`` failed as
    "[Errno 2] No such file or directory", naming no flag; "" and "." made folders "2" and ".2"; "../x" and "/x" one
    outside --project."""
    if name in ("", ".", "..") or Path(name).name != name or "\\" in name:  # a Windows separator, on any system
        return (f"--name {name!r}: a run's name is one folder name (not empty, '.', '..' or a path); put the folders "
                "above it in --project")
    return None


def claim_run_dir(project: str | Path, name: str) -> Path:
    """Create and return ``project/name``, or ``name2``, ``name3``... when taken.

    ``os.mkdir`` without ``exist_ok`` either creates the folder or fails because it exists, in one step: two
    runs started at the same moment never share a folder (checking ``exists()`` first would let both pass).
    """
    if problem := name_problem(name):
        raise ValueError(problem)
    base = Path(project)
    if base.exists() and not base.is_dir():  # mkdir would say only "File exists"
        raise NotADirectoryError(f"{base}: --project names a file, not a folder for run folders")
    base.mkdir(parents=True, exist_ok=True)
    number = 1
    while True:
        candidate = base / (name if number == 1 else f"{name}{number}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            number += 1


@contextmanager
def run_folder(project: str | Path, name: str) -> Iterator[Path]:
    """:func:`claim_run_dir` for the ``with`` block; when the block raises, the folder and what the block wrote
    into it are removed, so a failed command leaves no empty or half-filled run folder behind."""
    made_project = not Path(project).exists()
    folder = claim_run_dir(project, name)
    try:
        yield folder
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        if made_project:  # ``runs/predict`` made for this folder alone goes too (unless another run is in it now)
            with suppress(OSError):
                Path(project).rmdir()
        raise


def newest_file(root: str | Path, pattern: str) -> Path | None:
    files = sorted(Path(root).glob(pattern), key=lambda p: p.stat().st_mtime)
    return files[-1] if files else None


def append_results(csv_path: Path, row: dict[str, object]) -> None:
    """Add one epoch row; the header is written with the first row. Floats get 6 significant digits.

    The file is rewritten whole through the atomic writer (a few kB even after hundreds of epochs), so a crash
    mid-write leaves the previous epochs' file, never a cut row.
    """
    previous = csv_path.read_bytes().decode() if csv_path.is_file() else ""  # bytes: keeps csv's \r\n
    buffer = io.StringIO()
    values = {k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()}
    header = next(csv.reader(io.StringIO(previous)), None) if previous else None
    if header is not None and header != list(row):
        # A run resumed by a newer version, whose rows have columns the file lacks (or in another order): the
        # file's columns stay where they are, new ones go at the end, empty in the older rows.
        columns = header + [key for key in row if key not in header]
        writer = csv.DictWriter(buffer, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows(csv.DictReader(io.StringIO(previous)))
        writer.writerow(values)
        write_text_atomically(csv_path, buffer.getvalue())
        return
    writer = csv.DictWriter(buffer, fieldnames=list(row))
    if not previous:
        writer.writeheader()
    writer.writerow(values)
    write_text_atomically(csv_path, previous + buffer.getvalue())


def last_results_epoch(csv_path: Path) -> int:
    """The last epoch (1-based) ``results.csv`` holds; 0 where it holds none or is missing."""
    return keep_results_through(csv_path, sys.maxsize)  # drops nothing: only reads


def keep_results_through(csv_path: Path, epochs: int) -> int:
    """Drop the rows of epochs after ``epochs`` (1-based, as the file counts) from ``results.csv``, atomically;
    return the last epoch the file then holds (0: none, or no file).

    A resumed run continues from its last.pt, which is written at a cadence (detector/training/checkpoint_writer.py):
    a run that died epochs after it had written rows for those epochs, which the resumed run trains again and
    writes anew. Rows that cannot be read as an epoch number are kept (a hand-edited file is not ours to judge).
    """
    if not csv_path.is_file():
        return 0
    rows = list(csv.reader(io.StringIO(csv_path.read_bytes().decode(), newline="")))
    if not rows or "epoch" not in rows[0]:
        return 0
    column, kept, last = rows[0].index("epoch"), rows[:1], 0
    for row in rows[1:]:
        try:
            epoch = int(row[column])
        except (ValueError, IndexError):
            kept.append(row)
            continue
        if epoch <= epochs:
            kept.append(row)
            last = max(last, epoch)
    if len(kept) < len(rows):
        buffer = io.StringIO()
        csv.writer(buffer).writerows(kept)  # the writer append_results uses: the same bytes for its rows
        write_text_atomically(csv_path, buffer.getvalue())
    return last
