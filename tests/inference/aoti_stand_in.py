"""A stand-in for AOTInductor's package loader, for tests of what a load leaves in the temp dir.

It does to the temp dir what torch 2.14's loader does: unpack into ``$TMPDIR/aotinductor_XXXXXX`` (TMPDIR read when
loading, as ``c10::make_tempdir`` does) and remove that folder in its destructor only.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from detector.model.metadata import ModelInfo, encode_metadata

IMGSZ = 64


def package_metadata(device: str = "cpu") -> dict[str, str]:
    """Our metadata and AOTInductor's device key, as a compiled package holds them."""
    info = ModelInfo(names=["circle", "square", "triangle"], strides=(8, 16, 32), imgsz=IMGSZ)
    return {**encode_metadata(info), "AOTI_DEVICE_KEY": device}


class StandInLoader:
    """``fail``: raise after unpacking, as the C++ loader's constructor does for a CUDA package without a GPU (a
    constructor that throws runs no destructor, so the folder stays)."""

    def __init__(self, *, device: str = "cpu", fail: bool = False) -> None:
        self.folder: str | None = tempfile.mkdtemp(prefix="aotinductor_", dir=os.environ.get("TMPDIR", "/tmp"))
        if fail:
            folder, self.folder = self.folder, None
            raise RuntimeError(f"Cannot load AOTInductor package for device 'cuda' (unpacked in {folder})")
        self.metadata = package_metadata(device)

    def get_metadata(self) -> dict[str, str]:
        return self.metadata

    def __del__(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
