"""Where data YAMLs and datasets live, and what ``python -m detector download NAME`` would fetch.

* The shipped YAMLs (``coco.yaml``, ``coco128.yaml``, ``VOC.yaml``, ``shapes.yaml``, and Ultralytics' small
  detection sets: ``coco8.yaml`` ... :data:`SMALL_DATASETS`) are the files of the top-level ``data/`` folder; a
  non-editable install copies them to ``detector/datasets/`` (see pyproject.toml).
* ``--data NAME`` is a path first, then a shipped YAML (``coco`` and ``coco.yaml`` both work; case does
  not matter, so ``voc``, ``VOC`` and ``VOC.yaml`` all name ``VOC.yaml``).
* The datasets root holds downloaded datasets and the generated built-in one: ``--datasets-dir``, else
  ``$DETECTOR_DATASETS``, else ``datasets/`` in the data folder (:func:`detector.paths.data_home`:
  ``$DETECTOR_HOME``, else a checkout's own folder, else ``~/.local/share/detector``), never the installed package.

No network code here: :mod:`detector.data.download` does the fetching; this module only describes it,
so the loader can say in one line what is missing and which command fetches it.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from detector.data.voc import convert_voc
from detector.paths import HOME_ENV, default_datasets_dir, source_checkout

DATASETS_ENV = "DETECTOR_DATASETS"
PACKAGE_DIR = Path(__file__).resolve().parents[1]


def shipped_yaml_dir() -> Path:
    """``detector/datasets`` when installed from a wheel, else the repository's top-level ``data/``."""
    installed = PACKAGE_DIR / "datasets"
    return installed if installed.is_dir() else PACKAGE_DIR.parent / "data"


def shipped_yaml_names() -> list[str]:
    return sorted(path.stem for path in shipped_yaml_dir().glob("*.yaml"))


def resolve_data_yaml(name: str | Path) -> Path:
    """The data YAML ``name`` refers to: the path as given, else a shipped YAML of that name.

    Returns the path as given when neither exists, so the caller's "not found" names what the user typed.
    """
    path = Path(name)
    if path.is_file() or path.is_absolute():
        return path
    shipped = shipped_yaml_dir() / path
    for candidate in (shipped, shipped.with_name(shipped.name + ".yaml")):
        if candidate.is_file():
            return candidate
    if len(path.parts) == 1:  # a bare name: match it without regard to case (Ultralytics spells it VOC.yaml)
        wanted = {path.name.lower(), path.name.lower() + ".yaml"}
        for candidate in sorted(shipped_yaml_dir().glob("*.yaml")):
            if candidate.name.lower() in wanted:
                return candidate
    return path


def datasets_root(explicit: str | Path | None = None) -> Path:
    """The folder that ``relative_to: datasets`` YAMLs resolve their ``path`` against (absolute)."""
    chosen = explicit or os.environ.get(DATASETS_ENV) or default_datasets_dir()
    return Path(chosen).expanduser().absolute()


def datasets_root_source(explicit: str | Path | None = None) -> str:
    """What chose :func:`datasets_root`, as the missing-dataset line says it: the flag, a variable, or a default."""
    if explicit:
        return "set by --datasets-dir"
    if os.environ.get(DATASETS_ENV):
        return f"set by ${DATASETS_ENV}"
    others = f"--datasets-dir or ${DATASETS_ENV} choose another"
    if os.environ.get(HOME_ENV):
        return f"from ${HOME_ENV}; {others}"
    return f"the {'checkout' if source_checkout() else 'user data folder'}'s default; {others}"


@dataclass(frozen=True)
class Archive:
    """One zip: its official URL, published size and digest, and what it leaves in the dataset's folder.

    ``sha256`` is what a download is checked against; where none could be pinned, the ``md5`` its publisher gives;
    with neither, the file is checked by size and zip CRCs and its SHA-256 is printed (detector.data.download).

    ``provides`` names what the zip leaves that the YAML reads (its first part: the zip's top-level entries), or for
    a dataset with a ``convert`` step the folders the conversion makes from it; all present (a file, or a folder
    that is not empty) = already done, so the archive is not fetched again.
    """

    url: str
    size: int  # bytes; approximate when ``md5`` is None and ``exact_size`` is False
    md5: str | None
    splits: tuple[str, ...]  # the splits it is needed for ("train", "val")
    provides: tuple[str, ...]  # paths under ``extract_to``; all present = already extracted (and converted)
    exact_size: bool = True
    sha256: str | None = None  # pinned from a named source (see DOWNLOADS), or None: unpinned
    # The zip may hold the dataset folder's own entries (images/, labels/) at its top level instead of the folder
    # itself; they are then unpacked into that folder. Ultralytics' unzip does this with any zip that has no single
    # top folder, so its YAMLs cannot tell us which form a zip has: where we could not look, we take either.
    flat: bool = False

    @property
    def filename(self) -> str:
        return self.url.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Download:
    name: str  # what ``python -m detector download NAME`` takes
    yaml: str  # the shipped YAML that describes the result
    extract_to: str  # folder under the datasets root the archives are unpacked in ("" = the root)
    archives: tuple[Archive, ...]
    folder: str = ""  # the dataset folder under the datasets root, when it is not ``name``
    convert: Callable[[Path], None] | None = None  # run on ``extract_to`` after each extraction

    @property
    def folder_name(self) -> str:
        return self.folder or self.name

    def command(self, archives: tuple[Archive, ...], root: Path | None = None) -> str:
        """The command that fetches ``archives``: ``--datasets-dir`` where ``root`` is not the default (the user
        named another: the command must name it too, quoted for copy and paste), ``--allow-http`` where one is
        served over plain http (COCO's zips: checked by size and MD5)."""
        command = f"python -m detector download {self.name}"
        if root is not None and root != datasets_root(None).resolve():
            command += f" --datasets-dir {shlex.quote(str(root))}"
        if any(archive.url.startswith("http://") for archive in archives):
            command += " --allow-http"
        return command

    def archives_for(self, split: str) -> tuple[Archive, ...]:
        """``all``: every archive; ``val``: only those the val split needs."""
        return self.archives if split == "all" else tuple(a for a in self.archives if split in a.splits)

    def missing(self, root: Path, split: str = "all") -> tuple[Archive, ...]:
        folder = root / self.extract_to
        return tuple(a for a in self.archives_for(split) if not all(_present(folder / p) for p in a.provides))

    def incomplete(self, root: Path, split: str = "all") -> tuple[Path, str] | None:
        """A top-level folder that a missing archive would extract but that exists all the same (made by hand,
        emptied, half copied), and what it lacks; None when there is none. Extraction renames whole folders into
        place and would refuse to overwrite it, so nothing can be fetched until it is moved away. A dataset with a
        ``convert`` step converts what it finds instead."""
        if self.convert is not None:
            return None
        folder = root / self.extract_to
        for archive in self.missing(root, split):
            for entry in archive.provides:
                top = PurePosixPath(entry).parts[0]
                if (folder / top).exists() and not _present(folder / entry):
                    lacks = "it is empty" if entry == top else f"no {PurePosixPath(entry).relative_to(top)}"
                    return folder / top, lacks
        return None


def _present(path: Path) -> bool:
    """A file, or a folder with something in it (an empty one is what ``mkdir -p`` leaves, not a dataset)."""
    return path.is_file() or (path.is_dir() and any(path.iterdir()))


ULTRALYTICS_ASSETS = "https://github.com/ultralytics/assets/releases/download/v0.0.0"


def ultralytics_zip(name: str, size: int, *, folder: str = "", yaml: str = "") -> Download:
    """One of Ultralytics' small detection sets: one zip, ``<folder>.zip`` on its assets release, of
    ``<folder>/{images,labels}/{train,val}`` (a ``test`` split, where there is one, comes with it), or of the same
    ``images/`` and ``labels/`` at its top level (:attr:`Archive.flat`). ``size``: bytes, as approximate as the size
    Ultralytics' YAML gives."""
    folder = folder or name
    provides = tuple(f"{folder}/{kind}/{split}" for kind in ("images", "labels") for split in ("train", "val"))
    archive = Archive(f"{ULTRALYTICS_ASSETS}/{folder}.zip", size, None, ("train", "val"), provides,
                      exact_size=False, flat=True)
    return Download(name, yaml or f"{name}.yaml", "", (archive,), folder="" if folder == name else folder)


# Ultralytics' small detection sets, the names its users type (``yolo train data=coco8.yaml``). UNPINNED, like
# coco128: no checksum is published for these assets and none could be found from this machine; their sizes are the
# approximate ones Ultralytics' YAMLs state (the fetch stops at twice that), and neither the sizes nor the zips'
# layouts could be checked against the host from here (hence ``flat``: either layout is taken). The download
# name is lower case, as the command takes any case; HomeObjects-3K keeps Ultralytics' spelling of its YAML, folder
# and zip.
SMALL_DATASETS = (
    ultralytics_zip("coco8", 1_000_000),
    ultralytics_zip("brain-tumor", 4_210_000),
    ultralytics_zip("medical-pills", 8_190_000),
    ultralytics_zip("signature", 11_300_000),
    ultralytics_zip("african-wildlife", 100_000_000),
    ultralytics_zip("construction-ppe", 178_400_000),
    ultralytics_zip("homeobjects-3k", 390_000_000, folder="homeobjects-3K", yaml="HomeObjects-3K.yaml"),
    ultralytics_zip("kitti", 390_500_000),
)

# Sizes and MD5s are the ones published with COCO 2017 and quoted by torchvision, mmdetection and others. COCO
# publishes no SHA-256 and none could be found from a second source, so these three are checked by their MD5
# (a pinned MD5 still cannot be matched by a forged file: that would take a second preimage). COCO's own host
# serves plain http (its https certificate is not reliably valid), so fetching them needs --allow-http.
COCO_ZIPS = "http://images.cocodataset.org"
DOWNLOADS = {
    "coco": Download("coco", "coco.yaml", "coco", (
        Archive(f"{COCO_ZIPS}/annotations/annotations_trainval2017.zip", 252_907_541,
                "f4bbac642086de4f52a3fdda2de5fa2c", ("train", "val"),
                ("annotations/instances_train2017.json", "annotations/instances_val2017.json")),
        Archive(f"{COCO_ZIPS}/zips/val2017.zip", 815_585_330, "442b8da7639aecaf257c1dceb8ba8c80",
                ("val",), ("val2017",)),
        Archive(f"{COCO_ZIPS}/zips/train2017.zip", 19_336_861_798, "cced6f7f71b7629ddf16f17bbcfab6b2",
                ("train",), ("train2017",)),
    )),
    # UNPINNED: Ultralytics publishes no checksum for this asset and none could be found from this machine (no
    # general internet). It is fetched over https from GitHub, capped at twice its approximate size, checked with
    # zipfile's CRC test before anything is extracted, and its SHA-256 printed with a warning.
    "coco128": Download("coco128", "coco128.yaml", "", (
        Archive(f"{ULTRALYTICS_ASSETS}/coco128.zip", 7_000_000, None,
                ("train", "val"), ("coco128/images/train2017", "coco128/labels/train2017"), exact_size=False),
    )),
    # Pascal VOC 2007 + 2012, the zips Ultralytics' VOC.yaml fetches (the official tars, re-packed). UNPINNED:
    # no checksum is published for them and none could be found from this machine: sizes are the approximate
    # ones shown on the release page (the fetch stops at twice that), the zip CRC test guards extraction, and
    # the SHA-256 is printed with a warning. Each zip unpacks into
    # VOC/VOCdevkit, which detector.data.voc converts into VOC/{images,labels}/<set><year>.
    "voc": Download("voc", "VOC.yaml", "VOC", (
        Archive(f"{ULTRALYTICS_ASSETS}/VOCtrainval_06-Nov-2007.zip", 446_000_000, None, ("train",),
                ("images/trainval2007", "labels/trainval2007"), exact_size=False),
        Archive(f"{ULTRALYTICS_ASSETS}/VOCtest_06-Nov-2007.zip", 438_000_000, None, ("val",),
                ("images/test2007", "labels/test2007"), exact_size=False),
        Archive(f"{ULTRALYTICS_ASSETS}/VOCtrainval_11-May-2012.zip", 1_950_000_000, None, ("train",),
                ("images/trainval2012", "labels/trainval2012"), exact_size=False),
    ), folder="VOC", convert=convert_voc),
    **{download.name: download for download in SMALL_DATASETS},
}


def fetching_command(filename: str) -> tuple[str, str] | None:
    """The download command for the dataset a URL's or an archive's file name belongs to (``coco128.zip``,
    ``val2017.zip``, ``VOC.yaml``), and the shipped YAML to pass once it is fetched; else None."""
    name = filename.lower()
    for download in DOWNLOADS.values():
        if name in (download.name + ".zip", download.yaml.lower()) or any(
                name == archive.filename.lower() for archive in download.archives):
            return download.command(download.archives), download.yaml
    return None


def human_size(size: int) -> str:
    return f"{size / 1e9:.1f} GB" if size >= 1e9 else f"{max(1, round(size / 1e6))} MB"


def download_hint(folder: Path, root: Path) -> str:
    """``"; fetch it (1.1 GB): python -m detector download coco"`` when ``folder`` is what a download makes."""
    relative = folder.relative_to(root) if folder.is_relative_to(root) else None
    top = relative.parts[0] if relative is not None and relative.parts else None
    download = next((d for d in DOWNLOADS.values() if d.folder_name == top), None)
    if download is None:
        return ""
    missing = download.missing(root) or download.archives
    approx = "" if all(a.exact_size for a in missing) else "about "
    found = download.incomplete(root)
    move = f"; {found[0]} exists but is incomplete ({found[1]}): move it away, then" if found else ""
    return (f"{move or ';'} fetch it ({approx}{human_size(sum(a.size for a in missing))}): "
            f"{download.command(missing, root)}")
