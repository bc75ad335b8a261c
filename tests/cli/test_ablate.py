import functools
import subprocess
from pathlib import Path

from detector.cli import ablate
from detector.cli.ablate import main


def test_ablate_amp_runs_end_to_end(yolo_yaml: Path, tmp_path: Path, capsys, monkeypatch):
    # Each variant trains in its own process: one that hangs must fail the test, not stall the suite.
    monkeypatch.setattr(ablate.subprocess, "run", functools.partial(subprocess.run, timeout=300))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # 64 px steps: two threads on 2 shared cores only wait on each other
    assert main(["--data", str(yolo_yaml), "--epochs", "1", "--project", str(tmp_path), "--imgsz", "64",
                 "--batch", "4", "--workers", "0", "--cache", "none", "--device", "cpu"]) == 0
    report = (tmp_path / "exp" / "ablation.md").read_text()
    assert "| fp32 |" in report and "1.00x" in report
    assert (tmp_path / "exp" / "ablation.png").read_bytes()[:4] == b"\x89PNG"
    rows = [line for line in report.splitlines() if line.startswith("| ") and "precision" not in line]
    assert len(rows) >= 1 and all(float(row.split("|")[2]) > 0 for row in rows)  # real images/s
