"""Run one benchmark measurement in a fresh Python process and read back its JSON result.

Every measurement gets its own process so nothing carries over between them: oneDNN reads its kernel-cache
size and glibc its malloc settings once per process, and peak memory is a per-process figure.
"""

from __future__ import annotations

import json
import subprocess
import sys

from checkout import ROOT  # importing it also puts the root on sys.path

RESULT = "RESULT "  # the script prints its result as this prefix and one line of JSON


def run_isolated(script: str, payload: dict, *, env: dict[str, str] | None = None) -> dict:
    """Run ``script`` (``python -c``) from the repo root with ``payload`` as JSON in ``sys.argv[1]``."""
    process = subprocess.run([sys.executable, "-c", script, json.dumps(payload)], capture_output=True, text=True,
                             cwd=ROOT, env=env, check=False)
    lines = [line for line in process.stdout.splitlines() if line.startswith(RESULT)]
    if process.returncode != 0 or not lines:
        raise RuntimeError(f"benchmark run failed:\n{process.stderr[-3000:]}")
    return json.loads(lines[-1][len(RESULT):])
