"""Run folders and the per-epoch ``results.csv``."""

from __future__ import annotations

import csv
from pathlib import Path


def next_run_dir(project: str | Path, name: str) -> Path:
    """``project/name``, or ``name2``, ``name3``... if taken."""
    base = Path(project)
    candidate, number = base / name, 2
    while candidate.exists():
        candidate, number = base / f"{name}{number}", number + 1
    return candidate


def newest_file(root: str | Path, pattern: str) -> Path | None:
    files = sorted(Path(root).glob(pattern), key=lambda p: p.stat().st_mtime)
    return files[-1] if files else None


def append_results(csv_path: Path, row: dict[str, object]) -> None:
    """Append one epoch row; the header is written with the first row. Floats get 6 significant digits."""
    new = not csv_path.is_file()
    with csv_path.open("a", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(row))
        if new:
            writer.writeheader()
        writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
