"""Importing this makes the checkout's ``detector`` importable from ``python benchmarks/NAME.py`` without the
package installed (the GPU image has no registry to install it from, and ``python benchmarks/x.py`` puts only
``benchmarks/`` on the path): the repository root goes first on ``sys.path``, so the code timed is this
checkout's, also beside an installed copy."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
