"""What loading a ``.pt2`` package unpacks is removed again: on close, on collection, after a failed load, at exit.

AOTInductor's loader is replaced by a stand-in that treats the temp dir as torch 2.14's does
(tests/inference/aoti_stand_in.py), so these run in seconds without a compiler. The real package, compiled once per
session, is checked the same way in tests/exporting/test_export_pt2.py.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch

from detector.inference.pt2_backend import Pt2Backend
from tests.inference.aoti_stand_in import IMGSZ, StandInLoader, package_metadata

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def temp_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temp dir of this test alone, for Python (tempfile) and for the loader (TMPDIR) alike."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setenv("TMPDIR", str(root))
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


@pytest.fixture
def package(tmp_path: Path) -> Path:
    """A zip file with our metadata where AOTInductor packages it: the backend checks that much before it calls the
    loader."""
    path = tmp_path / "best.pt2"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("best/data/aotinductor/model/stand-in.txt", "")
        archive.writestr("best/data/aotinductor/model/cstandin.wrapper_metadata.json", json.dumps(package_metadata()))
    return path


def stand_in(monkeypatch: pytest.MonkeyPatch, *, device: str = "cpu", fail: bool = False) -> None:
    monkeypatch.setattr(torch._inductor, "aoti_load_package",
                        lambda path, **options: StandInLoader(device=device, fail=fail))


def left_in(root: Path) -> list[str]:
    """The unpacked folders under ``root`` (ours and the loader's; importing torch._inductor adds a cache folder)."""
    return sorted(str(path.relative_to(root)) for pattern in ("detector-pt2-*", "aotinductor_*")
                  for path in root.rglob(pattern))


def test_close_removes_what_the_load_unpacked(temp_root: Path, package: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in(monkeypatch)
    backend = Pt2Backend(package)
    # Its metadata names no batch_free, as packages exported before the key: their batch was always free.
    assert backend.info.batch_free is None and backend.free_batch
    (ours,) = temp_root.glob("detector-pt2-*")  # the loader's folder inside ours: TMPDIR named ours for the load
    assert ours.name.startswith("detector-pt2-") and [path.name[:12] for path in ours.iterdir()] == ["aotinductor_"]
    assert os.environ["TMPDIR"] == str(temp_root)
    backend.close()
    backend.close()  # idempotent
    assert left_in(temp_root) == []
    with pytest.raises(RuntimeError, match="closed"):
        backend.infer(torch.zeros(1, 3, IMGSZ, IMGSZ, dtype=torch.uint8))


@pytest.mark.parametrize("how", ["collected", "device mismatch", "loader failed after unpacking"])
def test_nothing_stays_unpacked(temp_root: Path, package: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """A backend nobody closed (collected, with the reference cycle its forward makes), one refused for its device,
    and a load that threw after unpacking (torch 2.14 checks for CUDA then, and no destructor runs)."""
    stand_in(monkeypatch, device="cuda" if how == "device mismatch" else "cpu", fail=how.startswith("loader"))
    if how == "collected":
        Pt2Backend(package)
        gc.collect()
    else:
        with pytest.raises(ValueError, match="compiled for cuda" if how == "device mismatch" else "not a loadable"):
            Pt2Backend(package)
    assert left_in(temp_root) == []


@pytest.mark.parametrize("metadata", ["none", "foreign"])
def test_a_package_without_our_metadata_is_refused_before_the_loader_opens_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, metadata: str
) -> None:
    """The loader dlopens the package's .so, whose constructors run then: a replaced .so ran before the "not a
    loadable pt2 package" line. A package our export did not make is refused from its zip, the loader never called."""
    path = tmp_path / "other.pt2"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("other/data/aotinductor/model/c.wrapper.so", b"\x7fELF")
        if metadata == "foreign":  # what a package compiled by someone else holds: AOTInductor's keys only
            archive.writestr("other/data/aotinductor/model/c.wrapper_metadata.json", '{"AOTI_DEVICE_KEY": "cpu"}')
    opened = []
    monkeypatch.setattr(torch._inductor, "aoti_load_package", lambda *args, **options: opened.append(args))
    with pytest.raises(ValueError) as error:
        Pt2Backend(path)
    assert str(error.value).startswith(f"{path}: missing or malformed detector metadata")
    assert opened == []


def test_exit_removes_it_though_the_commands_skip_the_teardown(temp_root: Path, package: Path) -> None:
    """The commands end through detector.cli.exit_with, whose os._exit skips the interpreter's teardown: no loader's
    destructor ran, and every command that had loaded a package left its folder behind."""
    code = textwrap.dedent(f"""
        import detector.cli  # first, as every entry point
        import tempfile
        from pathlib import Path
        import torch
        from detector.inference.pt2_backend import Pt2Backend
        from tests.inference.aoti_stand_in import StandInLoader
        torch._inductor.aoti_load_package = lambda path, **options: StandInLoader()
        backend = Pt2Backend({str(package)!r})
        print(len(list(Path(tempfile.gettempdir()).rglob("aotinductor_*"))), "unpacked")
        detector.cli.exit_with(0)
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(temp_root)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "1 unpacked"
    assert left_in(temp_root) == []


def test_the_release_drops_the_graphs_before_the_loader(tmp_path: Path) -> None:
    """The captured graphs launch the package's kernels: at exit (the backend still alive) or on collection they go
    first, then the loader that unloads those kernels, then the folder."""
    from detector.inference.pt2_backend import release_unpacked

    gone: list[str] = []

    class Held:
        def __init__(self, name: str) -> None:
            self.name = name

        def __del__(self) -> None:
            gone.append(self.name)

    folder = tmp_path / "detector-pt2-x"
    folder.mkdir()
    release_unpacked([Held("graphs")], [Held("loader")], str(folder))
    assert gone == ["graphs", "loader"] and not folder.exists()


def test_the_cpp_builders_cuda_home_warning_is_quiet_on_a_cpu(tmp_path: Path) -> None:
    """torch's C++ builder, first imported by the pt2 load (and the compile), logs "No CUDA runtime is found" where a
    CUDA toolkit folder exists without a GPU: quiet under :func:`quiet_cpp_builder`, shown without it (a fresh
    process each: the builder says it once, when it is imported)."""
    script = ("import sys, contextlib\nfrom detector.inference.pt2_backend import quiet_cpp_builder\n"
              "with (quiet_cpp_builder() if sys.argv[1] == 'quiet' else contextlib.nullcontext()):\n"
              "    import torch.utils.cpp_extension\n")
    env = {**os.environ, "CUDA_HOME": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    said = {how: subprocess.run([sys.executable, "-c", script, how], env=env, capture_output=True, text=True,
                                check=True, timeout=120).stderr for how in ("quiet", "loud")}
    assert "No CUDA runtime is found" in said["loud"]
    assert "No CUDA runtime is found" not in said["quiet"]
