"""The package's own version is the one pyproject.toml gives the distribution."""

from __future__ import annotations

from pathlib import Path

import pytest

import detector
from detector.version import __version__


def test_the_package_version_is_pyprojects() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    assert __version__ == project["version"] == detector.__version__
