"""Atomic file writes: artefacts (exports, caches, every run output) appear whole or not at all, even with several
writers. Text, figures and images all go through :func:`atomic_file`; an image that cannot be encoded raises.
Also the files a folder holds as a user means them (:func:`folder_files`), for datasets and predict alike."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO


@contextmanager
def atomic_file(path: str | Path) -> Iterator[BinaryIO]:
    """A binary file to write that appears at ``path`` only when the ``with`` block ends without an error.

    It is written to a temporary file beside ``path``, fsynced, given the permissions a plain ``open`` would
    (mkstemp makes 0600, but runs, exports and caches are meant to be shared), then renamed over ``path``: a
    crash or an exception at any point leaves the old ``path`` (or none), never half a file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temporary, 0o666 & ~current_umask())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_atomically(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` through :func:`atomic_file`."""
    with atomic_file(path) as file:
        file.write(data)
    return Path(path)


def write_text_atomically(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through :func:`atomic_file`: config.yaml, results.txt, predictions.json."""
    return write_atomically(path, text.encode())


def write_image(path: str | Path, image_bgr: Any, params: Sequence[int] = ()) -> Path:
    """Encode ``image_bgr`` (``uint8 [H, W, 3]``, OpenCV's channel order) in the format of ``path``'s suffix and write
    it atomically. ``cv2.imwrite`` only returns False on failure; this raises ``OSError`` naming the file instead."""
    import cv2  # only callers that write images pay for the import

    path = Path(path)
    try:
        encoded, buffer = cv2.imencode(path.suffix or ".png", image_bgr, list(params))
    except cv2.error as error:  # an unknown suffix or an image OpenCV cannot encode
        raise OSError(f"{path}: could not encode the image ({str(error).strip().splitlines()[-1]})") from None
    if not encoded:
        raise OSError(f"{path}: could not encode the image as {path.suffix or '.png'}")
    return write_atomically(path, buffer.tobytes())


def current_umask() -> int:
    """The process's umask, read without changing it where Linux shows it (os.umask can only be read by
    setting it, and for that moment a file another thread creates would get the temporary mask)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def staging_folder(beside: Path) -> Iterator[Path]:
    """A hidden temporary folder next to the final outputs (same file system, so renames are atomic).

    Exports are written here, checked, and only then moved into place with :func:`publish`; the folder
    and whatever is left in it are removed on exit, success or not.
    """
    try:
        beside.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix=".export-", dir=beside))
    except OSError as error:  # a read-only or full folder: name it, not the hidden staging folder
        raise OSError(f"cannot write the export into {beside} ({error.strerror or error}): copy the weights into a "
                      "writable folder and export that copy") from None
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def publish(staged: Path, final: Path) -> Path:
    """Move a checked artefact from the staging folder to its final name in one rename."""
    os.replace(staged, final)
    return final


def folder_files(folder: Path, not_files: list[Path] | None = None) -> list[Path]:
    """Every file under ``folder``, as Ultralytics' recursive glob finds them: through linked folders too (a
    dataset's split linked in), each real folder once, the first way there in sorted order (two links to each
    other, or a folder linked twice, are read once); names that start with a dot left out (macOS's
    ``._photo.jpg`` metadata, hidden caches and copies). Each path keeps the folder names it was found under (a
    label is looked for beside those, not beside a link's target).

    A link to ``folder`` itself or to a folder above it is not followed, with one warning line naming it: the
    folders beside ``folder`` would be read through it (``images/train/loop -> ..`` pulled ``images/val`` into
    training as unlabelled backgrounds).

    ``not_files``, when given, collects the entries left out for being neither a file nor a folder (a link whose
    target is gone, a socket), so that a caller can name the ones it would have read.
    """
    files: list[Path] = []
    root = os.path.realpath(folder)
    above = {root, *(str(parent) for parent in Path(root).parents)}
    seen: set[str] = set()
    for current, subfolders, names in os.walk(folder, followlinks=True):
        seen.add(os.path.realpath(current))
        kept = []
        for name in sorted(name for name in subfolders if not name.startswith(".")):
            real = os.path.realpath(os.path.join(current, name))
            if real in above:
                print(f"warning: {os.path.join(current, name)} links to {real}, which holds it: not followed (it would "
                      f"read the folders beside {folder} too)", file=sys.stderr)
            elif real not in seen:
                kept.append(name)
        subfolders[:] = kept
        seen.update(os.path.realpath(os.path.join(current, name)) for name in subfolders)
        for name in (name for name in names if not name.startswith(".")):
            if Path(current, name).is_file():
                files.append(Path(current, name))
            elif not_files is not None:
                not_files.append(Path(current, name))
    return files
