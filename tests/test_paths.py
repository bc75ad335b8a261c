"""The data folder (detector/paths.py): $DETECTOR_HOME, else a source checkout, else the user's data folder."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from detector import paths
from detector.paths import HOME_ENV, data_home, default_datasets_dir, default_weights_dir, source_checkout, user_data_dir
from detector.weights import resolve_weights

REPO = Path(__file__).resolve().parents[1]


def test_this_tree_is_a_source_checkout():
    assert source_checkout() == REPO


def test_home_is_the_environment_then_the_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(HOME_ENV, raising=False)
    assert data_home() == REPO
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    assert data_home() == tmp_path / "home"
    assert default_datasets_dir() == tmp_path / "home" / "datasets"
    assert default_weights_dir() == tmp_path / "home" / "weights"
    assert not (tmp_path / "home").exists()  # naming a folder creates nothing


def test_an_installed_package_uses_the_user_data_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    site = tmp_path / "site-packages"
    (site / "detector").mkdir(parents=True)
    monkeypatch.setattr(paths, "PACKAGE_DIR", site / "detector")  # where a wheel puts it: no pyproject.toml beside
    monkeypatch.delenv(HOME_ENV, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert source_checkout() is None
    assert data_home() == tmp_path / "xdg" / "detector"
    assert default_weights_dir() == tmp_path / "xdg" / "detector" / "weights"


@pytest.mark.skipif(sys.platform in ("win32", "darwin"), reason="the XDG fallback is the Linux layout")
def test_without_xdg_the_fallback_is_local_share(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert user_data_dir() == tmp_path / ".local" / "share" / "detector"


def test_bare_weights_names_are_looked_up_in_the_home_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(HOME_ENV, str(tmp_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "yolov8s.pt").touch()
    assert resolve_weights("yolov8s.pt") == tmp_path / "weights" / "yolov8s.pt"
    with pytest.raises(FileNotFoundError, match=r"python -m detector download yolov8m$"):
        resolve_weights("yolov8m.pt")  # the default folder: the command needs no --weights-dir
