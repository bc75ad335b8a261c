"""What ``detector tune`` leaves in its folder, and reads back to resume.

    tune_results.csv           one row per finished iteration: iteration, fitness, mAP50-95, mAP50, seconds, then
                               each hyperparameter (our names); rewritten whole, atomically, after every iteration
    best_hyperparameters.yaml  the fittest iteration's settings, in our names: ``detector train
                               cfg=best_hyperparameters.yaml --data D`` trains them
    tune_args.yaml             the tune's settings (train's, the space, the iterations): --resume continues with them

Hyperparameters are written as the text Python gives the rounded value (``0.00123``, ``12.34567``), not to a fixed
number of significant digits: a resumed tune reads back exactly the values that were trained, so it draws what an
uninterrupted one would have drawn.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

from detector.files import write_text_atomically
from detector.runs import append_results
from detector.workflows.tune_space import is_integer

RESULTS = "tune_results.csv"
BEST = "best_hyperparameters.yaml"
SETTINGS = "tune_args.yaml"
FIXED_COLUMNS = ("iteration", "fitness", "mAP50-95", "mAP50", "seconds")


def run_metrics(results_csv: Path) -> tuple[float, float] | None:
    """(mAP50-95, mAP50) of the run's best epoch by mAP50-95, Ultralytics 8.4's fitness (DetMetrics.fitness); None
    when the run wrote no evaluated epoch. A NaN counts as 0."""
    if not results_csv.is_file():
        return None
    best: tuple[float, float] | None = None
    for row in csv.DictReader(io.StringIO(results_csv.read_text())):
        try:
            found = (float(row["mAP50-95"]), float(row["mAP50"]))
        except (KeyError, TypeError, ValueError):  # an epoch not evaluated leaves its cells empty
            continue
        found = tuple(0.0 if math.isnan(value) else value for value in found)  # type: ignore[assignment]
        if best is None or found[0] > best[0]:
            best = found
    return best


def value_text(value: float | int) -> str:
    return str(int(value)) if isinstance(value, int) else repr(float(value))


def append_row(folder: Path, iteration: int, metrics: tuple[float, float] | None, seconds: float,
               settings: dict[str, Any]) -> None:
    """One iteration's row; ``metrics`` None for a failed training (fitness 0, its mAP cells empty)."""
    fitness = metrics[0] if metrics else 0.0
    row: dict[str, object] = {"iteration": iteration, "fitness": f"{fitness:.6g}",
                              "mAP50-95": f"{metrics[0]:.6g}" if metrics else "",
                              "mAP50": f"{metrics[1]:.6g}" if metrics else "", "seconds": f"{seconds:.1f}"}
    row.update({name: value_text(value) for name, value in settings.items()})
    append_results(folder / RESULTS, row)


def read_rows(folder: Path) -> list[dict[str, Any]]:
    """tune_results.csv's rows, numbers as numbers (hyperparameters as int or float by their field's type)."""
    path = folder / RESULTS
    if not path.is_file():
        return []
    rows = []
    for raw in csv.DictReader(io.StringIO(path.read_text())):
        try:
            row: dict[str, Any] = {"iteration": int(raw["iteration"]), "fitness": float(raw["fitness"] or 0),
                                   "mAP50-95": float(raw["mAP50-95"]) if raw["mAP50-95"] else None,
                                   "mAP50": float(raw["mAP50"]) if raw["mAP50"] else None,
                                   "seconds": float(raw["seconds"] or 0)}
            row["settings"] = {name: int(text) if is_integer(name) else float(text)
                               for name, text in raw.items() if name not in FIXED_COLUMNS and text not in ("", None)}
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{path}: row {len(rows) + 1} cannot be read ({error}); not a tune's record") from None
        rows.append(row)
    return rows


def best_row(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The fittest row that trained (the first of equals); None when none did."""
    trained = [row for row in rows if row["mAP50-95"] is not None]
    return max(trained, key=lambda row: row["fitness"]) if trained else None


def write_best(folder: Path, best: dict[str, Any], done: int, iterations: int, train_flags: list[str]) -> Path:
    """best_hyperparameters.yaml: a header of comments (where it came from), then ``name: value`` lines."""
    lines = [f"# detector tune: best of {done} iterations (of {iterations}) in {folder}",
             f"# iteration {best['iteration']}: fitness (mAP50-95) {best['fitness']:.6g}, mAP50 {best['mAP50']:.6g}",
             f"# trained with: {' '.join(train_flags) or '(train defaults)'}",
             "# use: detector train cfg=best_hyperparameters.yaml (with the flags above)"]
    lines += [f"{name}: {value_text(value)}" for name, value in best["settings"].items()]
    return write_text_atomically(folder / BEST, "\n".join(lines) + "\n")


def write_settings(folder: Path, settings: dict[str, Any]) -> None:
    import yaml

    write_text_atomically(folder / SETTINGS, yaml.safe_dump(settings, sort_keys=False, default_flow_style=None))


def read_settings(folder: Path) -> dict[str, Any]:
    import yaml

    path = folder / SETTINGS
    try:
        loaded = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise ValueError(f"{path}: cannot read the tune's settings ({error}); --resume needs them") from None
    if not isinstance(loaded, dict):
        raise ValueError(f"{path}: not a tune's settings file; --resume needs it")
    return loaded
