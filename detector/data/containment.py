"""Paths built from data stay inside their folder: the checks for names read from label and list files.

A dataset's files name other files: a Pascal VOC ``ImageSets`` list names image ids, a COCO JSON names
``file_name`` s under its image folder, a YOLO ``.txt`` list names images. Joined to a folder as they are,
``../../x`` or ``/etc/x`` would reach outside it, and the VOC conversion *writes* what it reads, so a
hostile list could overwrite another dataset's files. These checks are lexical (on the text, before any
file is touched): a symlink inside a dataset that points elsewhere is the dataset owner's choice and is
followed as before; what is refused is a name whose own text climbs out.

Each check returns ``""`` for a safe name, else the reason in a few words, so every caller raises its own
error type with its own file and line in the message.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath, PureWindowsPath

SEPARATORS = re.compile(r"[\\/]")  # both, on every system: a Windows-made list says sub\a.jpg


def unsafe_relative(name: str) -> str:
    """Why ``name`` is not a relative path that stays inside the folder it is joined to ('' when it is).

    Subfolders (``train/a.jpg``) are fine; an absolute path, a drive (``C:``), a ``..`` part, an empty
    name or a NUL byte is not.
    """
    if not name:
        return "is empty"
    if "\x00" in name:
        return "holds a NUL byte"
    if PurePosixPath(name).is_absolute() or PureWindowsPath(name).anchor:
        return "is an absolute path"
    if ".." in SEPARATORS.split(name):
        return "climbs out of its folder with '..'"
    return ""


def unsafe_file_name(name: str) -> str:
    """Why ``name`` is not one plain file name (no folder part at all; '' when it is)."""
    reason = unsafe_relative(name)
    if reason:
        return reason
    if SEPARATORS.search(name):
        return "holds a path separator"
    if name == ".":
        return "is '.'"
    return ""


def lexically_inside(path: Path, folders: list[Path]) -> bool:
    """Whether ``path`` (absolute) lies inside one of ``folders`` once ``..`` is folded away, links unread."""
    normal = Path(os.path.normpath(path))
    return any(normal == Path(os.path.normpath(f)) or normal.is_relative_to(os.path.normpath(f)) for f in folders)
