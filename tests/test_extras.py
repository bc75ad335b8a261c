"""Optional packages (detector/extras.py): imported where used; a missing one is one line naming the extra."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from detector.extras import DISTRIBUTION, MissingExtra, install_hint, require

REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 120  # s: a cold `import torch` on a loaded 2-core machine takes ~10 s


def test_the_hint_names_the_distribution_and_the_extra():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["name"] == DISTRIBUTION
    assert {"export", "tensorboard", "dev"} <= set(project["optional-dependencies"])
    assert install_hint("export") == "pip install 'detector-yolo[export]'"


def test_require_imports_or_raises_one_line(monkeypatch: pytest.MonkeyPatch):
    assert require("json", "export", "reading JSON").dumps([1]) == "[1]"
    monkeypatch.setitem(sys.modules, "onnx", None)  # what `import onnx` meets when onnx is not installed
    with pytest.raises(MissingExtra) as error:
        require("onnx", "export", "ONNX export")
    assert str(error.value) == "ONNX export needs the 'onnx' package: pip install 'detector-yolo[export]'"
    assert isinstance(error.value, ImportError)


def test_no_install_hint_names_another_distribution():
    """`pip install detector` fetches a stranger's package: every hint in code and docs names ours."""
    pages = [REPO / "README.md", REPO / "Makefile", REPO / "pyproject.toml", *REPO.glob("docs/*.md"),
             *REPO.glob("weights/*.md"), *REPO.glob("detector/**/*.py"), *REPO.glob("benchmarks/*.py")]
    wrong = re.compile(r"pip install[^\n`]*?(?<![\w-])['\"]?detector(\[|['\"`\s]|$)", re.MULTILINE)
    self_reference = re.compile(r"['\"]detector\[")  # an extra depending on another: "detector[export]"
    found = [f"{page.relative_to(REPO)}: {match.group(0)}" for page in pages for text in [page.read_text()]
             for match in [*wrong.finditer(text), *self_reference.finditer(text)]]
    assert not found


def _without(modules: list[str], *argv: str) -> subprocess.CompletedProcess:
    """Run ``python export.py ARGV`` in a fresh interpreter where ``import`` of each of ``modules`` fails as if
    it were not installed."""
    code = (f"import runpy, sys; sys.modules.update(dict.fromkeys({modules!r})); "
            f"sys.argv = ['export.py', *{list(argv)!r}]; runpy.run_path('export.py', run_name='__main__')")
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT)


def test_export_help_needs_no_optional_package():
    result = _without(["onnx", "onnxruntime", "onnxslim"], "--help")  # one interpreter: each starts in ~6 s
    assert result.returncode == 0, result.stderr
    assert "--weights" in result.stdout and "Traceback" not in result.stderr


def test_export_without_onnx_says_which_extra(checkpoint: Path, tmp_path: Path):
    weights = Path(shutil.copy(checkpoint, tmp_path / "best.pt"))  # a folder of its own: nothing else exports here
    result = _without(["onnx"], "--weights", str(weights), "--device", "cpu")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "error: ONNX export needs the 'onnx' package: pip install 'detector-yolo[export]'"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt"]  # nothing written
