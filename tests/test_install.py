"""A non-editable install works from any folder and never writes into itself.

Builds the wheel from a copy of the source (so the checkout gets no ``build/``), installs it with
``pip install --target`` into a folder of its own, and runs the installed ``detector`` from an empty working
folder: ``train --data shapes`` (the built-in set, generated into the user's data folder), then ``val``,
``predict`` and (with the export extra) ``export`` on the run's best.pt. The installed tree is hashed before
and after: byte for byte the same.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BUILD_TIMEOUT = 180  # s: wheel build and install (~10 s here); generous for a loaded CI machine
RUN_TIMEOUT = 600  # s: the built-in set (~12 s) and one 64 px epoch (~20 s) on an idle 2-core CPU; a shared one is far slower


def tree_digest(root: Path) -> dict[str, str]:
    """SHA-256 of every file under ``root``, by relative path (bytecode caches included)."""
    return {str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(root.rglob("*")) if path.is_file()}


def run(command: list[str], cwd: Path, env: dict[str, str], timeout: int) -> subprocess.CompletedProcess:
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(command)} -> {result.returncode}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``<tmp>/site``: the wheel, installed with its console script in ``<tmp>/site/bin``."""
    pytest.importorskip("setuptools", reason="building the wheel offline needs setuptools in this environment")
    tmp = tmp_path_factory.mktemp("install")
    source = tmp / "source"
    shutil.copytree(REPO / "detector", source / "detector", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "data", source / "data", ignore=shutil.ignore_patterns("shapes"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, source / name)
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}  # offline: nothing fetched
    pip = [sys.executable, "-m", "pip", "--quiet"]
    run([*pip, "wheel", "--no-deps", "--no-build-isolation", ".", "-w", str(tmp / "dist")], source, env, BUILD_TIMEOUT)
    wheel, = (tmp / "dist").glob("*.whl")
    assert wheel.name.startswith("detector_yolo-")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "detector/datasets/shapes.yaml" in names and "detector/paths.py" in names
    assert "Name: detector-yolo" in metadata and "Requires-Python: >=3.11" in metadata
    run([*pip, "install", "--no-deps", "--target", str(tmp / "site"), str(wheel)], tmp, env, BUILD_TIMEOUT)
    return tmp / "site"


def test_the_installed_package_trains_from_another_folder_and_stays_unchanged(installed: Path, tmp_path: Path):
    before = tree_digest(installed)
    work, xdg = tmp_path / "work", tmp_path / "xdg"
    work.mkdir()
    env = {key: value for key, value in os.environ.items() if not key.startswith("DETECTOR_")}
    env.update(PYTHONPATH=str(installed), XDG_DATA_HOME=str(xdg), HOME=str(tmp_path / "home"),
               PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1")  # one thread: no spinning on shared cores
    tiny = ["--imgsz", "64", "--batch", "64", "--workers", "0", "--device", "cpu"]  # 8 steps of 64 images
    run([str(installed / "bin" / "detector"), "train", "--data", "shapes", "--epochs", "1", "--no-plots",
         "--no-amp-check", *tiny], work, env, RUN_TIMEOUT)
    best = work / "runs" / "train" / "exp" / "weights" / "best.pt"
    assert best.is_file()
    shapes = xdg / "detector" / "datasets" / "shapes"
    assert len(list((shapes / "images" / "train").glob("*.jpg"))) == 512  # the built-in set, in the data folder
    result = run([sys.executable, "-m", "detector", "val", "--weights", str(best), "--data", "shapes", *tiny],
                 work, env, RUN_TIMEOUT)
    assert "IoU=0.50:0.95" in result.stdout and (work / "runs" / "val" / "exp").is_dir()
    assert "generating" not in result.stdout  # the set made by train is found, not made again
    image = sorted((shapes / "images" / "val").glob("*.jpg"))[0]
    run([sys.executable, "-m", "detector", "predict", "--weights", str(best), "--source", str(image), "--save",
         "--device", "cpu"], work, env, RUN_TIMEOUT)
    assert (work / "runs" / "predict" / "exp" / image.name).is_file()
    if importlib.util.find_spec("onnx") and importlib.util.find_spec("onnxruntime"):  # the export extra
        run([sys.executable, "-m", "detector", "export", "--weights", str(best), "--device", "cpu"], work, env,
            RUN_TIMEOUT)
        assert best.with_suffix(".onnx").is_file()
    assert str(installed) in run([sys.executable, "-c", "import detector; print(detector.__file__)"],
                                 work, env, RUN_TIMEOUT).stdout  # it ran the installed copy, not the checkout
    assert tree_digest(installed) == before
