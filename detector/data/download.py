"""``python -m detector download NAME [--split val] [--datasets-dir D]``: coco, coco128, voc, coco8 ... (the catalog).

Fetch, verify, extract (convert), prove.

Downloads are explicit: nothing else in ``detector`` touches the network, and a YAML's ``download:``
entry is never run. For each archive the dataset still lacks:

1. fetch it into ``<root>/<file>.part`` with a progress bar (:mod:`detector.data.transfer`), over https only
   (``allow_http`` / ``--allow-http`` lets plain http through, redirects included) and never more bytes than the
   catalog allows, whatever the server announces; a cut transfer resumes with an HTTP ``Range`` request (a server
   that ignores ``Range`` and sends the whole file restarts it);
2. verify the whole file, resumed or not, against the SHA-256 pinned in the catalog (or the MD5 COCO
   publishes; with neither, say so and print the file's SHA-256), and always zipfile's CRC test, before
   anything is extracted; a file that fails is deleted;
3. extract into a temporary folder in the datasets root, at most :data:`EXTRACT_RATIO` times the zip's size
   (a zip bomb stops there), and rename its entries into place, so a failure leaves nothing half-extracted;
   only the top-level entries the dataset reads are unpacked (others are named in a note); a zip of Ultralytics' small
   sets may hold its dataset folder's ``images/`` and ``labels/`` at its top level instead of the folder itself, and
   those are unpacked into that folder; then delete the zip;
4. where the dataset has a ``convert`` step (VOC: XML -> YOLO txt, :mod:`detector.data.voc`), run it.

All of it runs under ``<root>/<name>.lock`` (:mod:`detector.data.lock`): a second download of the same dataset
stops at once, naming the first one's pid, instead of truncating its ``.part``.

It ends by loading the shipped YAML against the root, which proves the layout is what training reads.
``$DETECTOR_DOWNLOAD_URL`` (or ``base_url``) fetches every archive from ``<base>/<file name>`` instead:
a mirror, or a local server in the tests; the same digests and caps apply. docs/security.md has the policy.
"""

from __future__ import annotations

import glob
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Collection
from pathlib import Path, PurePosixPath

from detector.data.catalog import DOWNLOADS, Archive, Download, human_size, shipped_yaml_dir
from detector.data.spec import load_dataset_spec, load_split
from detector.data.transfer import (CHUNK_BYTES, DownloadError, check_transport, digest_problem, fetch, mirrored_url,
                                    one_download, warn_unpinned)

# Unzipped bytes allowed per zipped byte. Photographs do not compress (20 coco128 JPEGs deflate 1.00x) and COCO's
# JSON deflates 3.3x (coco128's instances_train2017.json, zlib level 9); ten times leaves room for any dataset
# we ship, and stops a zip bomb (1000x and more) after a few times the archive's size.
EXTRACT_RATIO = 10
# Bytes fetched for an archive whose size the catalog knows only roughly (coco128, VOC): twice that.
APPROXIMATE_SIZE_MARGIN = 2


def archive_url(archive: Archive, base_url: str | None = None) -> str:
    return mirrored_url(archive.url, base_url)


def _zip_problem(path: Path) -> str | None:
    """Why the zip cannot be extracted safely, or None."""
    try:
        with zipfile.ZipFile(path) as archive:
            for name in archive.namelist():
                parts = PurePosixPath(name).parts
                if name.startswith(("/", "\\")) or ".." in parts or (parts and ":" in parts[0]):
                    return f"unsafe member path {name!r}"
            bad = archive.testzip()
            return f"member {bad!r} fails its CRC check" if bad else None
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        return f"not a readable zip ({error})"


def expected_tops(archive: Archive) -> list[str]:
    """The top-level entries of ``archive`` that its dataset reads (the first parts of ``archive.provides``)."""
    return sorted({PurePosixPath(entry).parts[0] for entry in archive.provides})


def top_entries(path: Path) -> list[str]:
    """The names at the zip's top level, sorted."""
    with zipfile.ZipFile(path) as bundle:
        return sorted({PurePosixPath(name).parts[0] for name in bundle.namelist() if PurePosixPath(name).parts})


def flat_entries(archive: Archive) -> list[str]:
    """What a :attr:`~detector.data.catalog.Archive.flat` zip may hold at its top level in place of its dataset
    folder: the entries of that folder the dataset reads (``images``, ``labels``); [] for any other archive."""
    if not archive.flat:
        return []
    return sorted({PurePosixPath(entry).parts[1] for entry in archive.provides})


def layout_problem(tops: list[str], expected: list[str], flat: list[str] | None = None) -> str | None:
    """What the zip's top level ``tops`` (:func:`top_entries`) lacks of the ``expected`` entries
    (:func:`expected_tops`: for a dataset without a ``convert`` step), or None. Where ``flat``
    (:func:`flat_entries`) is given, a zip holding all of those at its top level is accepted too.

    Checked before extracting: a zip with another top folder (``coco128-main/``) used to be extracted and deleted,
    after which the dataset was still missing and the hint named the same command again, for ever.
    """
    if set(expected) <= set(tops) or (flat and set(flat) <= set(tops)):
        return None
    held = ", ".join(tops[:3]) + (f" and {len(tops) - 3} more" if len(tops) > 3 else "") if tops else "nothing"
    return f"holds {held} at its top level, not {', '.join(expected)}" + (f" (nor {', '.join(flat)})" if flat else "")


def verify(path: Path, archive: Archive, url: str, *, fetched: bool = True) -> None:
    """Size, then the pinned digest (:func:`digest_problem`), then the zip's own CRCs. A file that fails is deleted
    when this run ``fetched`` it; one that was there before (the user's, perhaps) is left as it is."""
    size = path.stat().st_size
    if archive.exact_size and size != archive.size:
        problem = f"{size} bytes, expected {archive.size}"
    else:
        problem = digest_problem(path, sha256=archive.sha256, md5=archive.md5) or _zip_problem(path)
    if problem and not fetched:
        raise DownloadError(f"{path}: {problem}; it was there before this run, so it is left as it is: move it away "
                            "and run the command again to fetch it anew")
    if problem:
        path.unlink()
        raise DownloadError(f"{path} (from {url}): {problem}; deleted it, run the command again to fetch it anew")


def _copy_member(archive: zipfile.ZipFile, member: zipfile.ZipInfo, staging: Path, budget: list[int]) -> None:
    """Write one member under ``staging``, counting its bytes against ``budget[0]`` as they are decompressed (the
    sizes in a zip's directory are the archive's word, not a promise)."""
    target = staging.joinpath(*PurePosixPath(member.filename).parts)  # member names were checked by _zip_problem
    if member.is_dir():
        target.mkdir(parents=True, exist_ok=True)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    with archive.open(member) as source, target.open("wb") as sink:
        while chunk := source.read(CHUNK_BYTES):
            budget[0] -= len(chunk)
            if budget[0] < 0:
                raise _ExtractionCap()
            sink.write(chunk)


def declared_size(archive: zipfile.ZipFile) -> int:
    """The unpacked size the zip's directory declares (its word only: :func:`_copy_member` counts what comes)."""
    return sum(member.file_size for member in archive.infolist())


class _ExtractionCap(Exception):
    """More bytes came out of the zip than :data:`EXTRACT_RATIO` allows."""


def extract(path: Path, destination: Path, root: Path, only: Collection[str] | None = None, under: str = "") -> None:
    """Unpack ``path`` into ``destination`` all at once: into a temporary folder in ``root``, then rename.

    ``only``: the top-level entries to unpack (None: all); the others are not written.
    ``under``: a folder the members are unpacked into (``images/x.jpg`` -> ``<destination>/<under>/images/x.jpg``),
    for a flat zip (:func:`flat_entries`); staged as that one folder, so it too appears whole or not at all.
    At most :data:`EXTRACT_RATIO` times the zip's size is unpacked: the declared sizes are checked first, the bytes
    actually decompressed while extracting.
    """
    limit = EXTRACT_RATIO * path.stat().st_size
    staging = Path(tempfile.mkdtemp(prefix=f".{path.stem}-", suffix=".extracting", dir=root))
    created = not destination.exists()
    cap = (f"{path}: unpacks to more than {human_size(limit)} ({EXTRACT_RATIO}x its size), the most a dataset zip "
           "may hold; not extracted (a zip bomb?)")
    try:
        with zipfile.ZipFile(path) as archive:
            if declared_size(archive) > limit:
                raise DownloadError(cap)
            budget = [limit]
            for member in archive.infolist():
                parts = PurePosixPath(member.filename).parts
                if only is None or (parts and parts[0] in only):
                    _copy_member(archive, member, staging / under if under else staging, budget)
        entries = sorted(staging.iterdir())
        clashes = [entry.name for entry in entries if (destination / entry.name).exists()]
        if clashes:
            raise DownloadError(f"{path}: {destination / clashes[0]} already exists; move it away and run again")
        destination.mkdir(parents=True, exist_ok=True)
        for entry in entries:  # renames within one filesystem: each entry appears whole or not at all
            entry.rename(destination / entry.name)
    except _ExtractionCap:
        raise DownloadError(cap) from None
    except (OSError, zipfile.BadZipFile) as error:
        if created and destination.is_dir() and not any(destination.iterdir()):
            destination.rmdir()
        raise DownloadError(f"{path}: extraction into {destination} failed ({error})") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def remove_stale_staging(download: Download, root: Path) -> None:
    """Delete the staging folders an extraction of ``download``'s archives left when its process was killed (tens of
    GB for COCO, hidden, for ever). Called under the dataset's lock, so no live extraction owns them."""
    for archive in download.archives:
        for left in sorted(root.glob(f".{glob.escape(Path(archive.filename).stem)}-*.extracting")):
            if left.is_dir():
                shutil.rmtree(left, ignore_errors=True)
                print(f"{download.name}: removed {left}, left by an interrupted extraction", file=sys.stderr)


def convert(download: Download, folder: Path) -> None:
    """Run the dataset's conversion step on ``folder``, if it has one; an OS error becomes one line."""
    if download.convert is None:
        return
    try:
        download.convert(folder)
    except OSError as error:
        raise DownloadError(f"{folder}: converting {download.name} failed ({error}); "
                            "run the command again to finish it") from None


def prove(download: Download, root: Path, split: str) -> str:
    """Load the shipped YAML against ``root``; returns a one-line summary. Raises DatasetError."""
    yaml_path = shipped_yaml_dir() / download.yaml
    if split == "all":
        spec = load_dataset_spec(yaml_path, datasets_dir=root)
        return f"{download.yaml} loads: {spec.num_classes} classes"
    load_split(yaml_path, split, datasets_dir=root)
    return f"{download.yaml} loads its {split} split"


def download(dataset: str | Download, *, root: Path, split: str = "all", base_url: str | None = None,
             allow_http: bool = False, timeout: float = 30.0, attempts: int = 3, retry_wait: float = 2.0) -> Path:
    """Fetch, verify and extract what ``dataset`` still lacks under ``root``; returns the dataset folder.

    ``allow_http``: accept plain http URLs (a mirror, or COCO's own host); the digests are checked all the same.
    """
    spec = DOWNLOADS[dataset] if isinstance(dataset, str) else dataset
    root.mkdir(parents=True, exist_ok=True)
    destination = root / spec.extract_to
    with one_download(root / f"{spec.name}.lock", f"{spec.name} into {root}"):
        remove_stale_staging(spec, root)
        if destination.is_dir():
            convert(spec, destination)  # finishes what an interrupted run extracted but did not convert
        if found := spec.incomplete(root, split):  # checked before a fetch that could never be extracted
            raise DownloadError(f"{found[0]}: exists but is incomplete ({found[1]}): move it away and run the command "
                                "again")
        for archive in spec.missing(root, split):
            url = archive_url(archive, base_url)
            check_transport(url, allow_http=allow_http)  # before saying "fetching"
            approx = "" if archive.exact_size else "about "
            print(f"{spec.name}: fetching {url} ({approx}{human_size(archive.size)}) into {root}")
            fetched = not (root / archive.filename).exists()  # else kept by an earlier run, or put there by hand
            path = fetch(url, root / archive.filename, archive.size if archive.exact_size else None,
                         max_bytes=archive.size * (1 if archive.exact_size else APPROXIMATE_SIZE_MARGIN),
                         allow_http=allow_http, timeout=timeout, attempts=attempts, retry_wait=retry_wait)
            verify(path, archive, url, fetched=fetched)
            # Only what the dataset reads is extracted (None: a converted dataset's zip, all of it): a zip's other
            # top-level entries (__MACOSX/, a README) landed in the shared datasets root, where the next extraction
            # of a zip holding the same name refused to run.
            only, tops = (expected_tops(archive), top_entries(path)) if spec.convert is None else (None, [])
            if only is not None and (problem := layout_problem(tops, only, flat_entries(archive))):
                raise DownloadError(f"{path} (from {url}): {problem}, so it is not {spec.name}'s archive; kept it and "
                                    "extracted nothing: delete it, and check the mirror if one is set")
            under = ""
            if only is not None and not set(only) <= set(tops):  # a flat zip (layout_problem let it through)
                only, under = flat_entries(archive), only[0]
                print(f"{spec.name}: {archive.filename} holds {', '.join(only)} at its top level: unpacking them into "
                      f"{destination / under}")
            if not archive.sha256 and not archive.md5:
                warn_unpinned(path)  # accepted now: its SHA-256 is worth comparing
            if extra := sorted(set(tops) - set(only or ())):
                print(f"note: {spec.name}: not extracted from {archive.filename}, which {spec.name} does not "
                      f"read: {', '.join(extra[:5])}{f' and {len(extra) - 5} more' if len(extra) > 5 else ''}",
                      file=sys.stderr)
            extract(path, destination, root, only, under)
            path.unlink()  # the extracted files are what training reads; the zip would double the disk use
            convert(spec, destination)
    folder = root / spec.folder_name
    print(f"{spec.name}: ready in {folder} ({prove(spec, root, split)})")
    return folder
