"""``python -m detector download coco|coco128|voc [--split val] [--datasets-dir D]``.

Fetch, verify, extract (convert), prove.

Downloads are explicit: nothing else in ``detector`` touches the network, and a YAML's ``download:``
entry is never run. For each archive the dataset still lacks:

1. fetch it into ``<root>/<file>.part`` with a progress bar; a cut transfer resumes with an HTTP
   ``Range`` request (a server that ignores ``Range`` and sends the whole file restarts it);
2. verify the size and MD5 published with it (see :data:`detector.data.catalog.DOWNLOADS`), and always
   zipfile's CRC test, before anything is extracted; a corrupt file is deleted;
3. extract into a temporary folder in the datasets root and rename its entries into place, so a failure
   leaves nothing half-extracted; then delete the zip;
4. where the dataset has a ``convert`` step (VOC: XML -> YOLO txt, :mod:`detector.data.voc`), run it.

It ends by loading the shipped YAML against the root, which proves the layout is what training reads.
``$DETECTOR_DOWNLOAD_URL`` (or ``base_url``) fetches every archive from ``<base>/<file name>`` instead:
a mirror, or a local server in the tests.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path, PurePosixPath

from tqdm import tqdm

from detector.data.catalog import DOWNLOADS, Archive, Download, human_size, shipped_yaml_dir
from detector.data.spec import load_dataset_spec, load_split

BASE_URL_ENV = "DETECTOR_DOWNLOAD_URL"
CHUNK_BYTES = 1 << 20


class DownloadError(RuntimeError):
    """A download that cannot go on; the message is one line naming the URL or file."""


class CutTransfer(Exception):
    """The connection ended before the whole body arrived; what came is kept in the ``.part`` file."""


def mirrored_url(url: str, base_url: str | None = None) -> str:
    """``url``, or ``<base>/<its file name>`` when ``base_url`` or ``$DETECTOR_DOWNLOAD_URL`` names a mirror."""
    base = base_url or os.environ.get(BASE_URL_ENV)
    return f"{base.rstrip('/')}/{url.rsplit('/', 1)[-1]}" if base else url


def archive_url(archive: Archive, base_url: str | None = None) -> str:
    return mirrored_url(archive.url, base_url)


def _open(url: str, start: int, timeout: float) -> http.client.HTTPResponse:
    headers = {"Range": f"bytes={start}-"} if start else {}
    try:
        return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)
    except urllib.error.HTTPError as error:
        if error.code == 416 and start:  # the .part is no prefix the server can continue: start over
            return _open(url, 0, timeout)
        raise DownloadError(f"{url}: HTTP {error.code} {error.reason}") from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise DownloadError(f"{url}: cannot connect ({reason})") from None


def _resumes_at(response: http.client.HTTPResponse, start: int) -> bool:
    """True when the server answered the Range request with the bytes from ``start`` on."""
    content_range = response.headers.get("Content-Range", "")
    return response.status == 206 and content_range.startswith(f"bytes {start}-")


def _transfer(url: str, part: Path, size: int | None, *, timeout: float, label: str) -> int:
    """Append the rest of ``url`` to ``part``; returns the expected total size. Raises :class:`CutTransfer`."""
    start = part.stat().st_size if part.exists() else 0
    with _open(url, start, timeout) as response:
        if start and not _resumes_at(response, start):
            if response.status == 206:  # some other byte range: useless here, so start over without Range
                part.unlink()
                raise CutTransfer(f"server sent {response.headers.get('Content-Range')!r} for bytes={start}-")
            start = 0  # the server ignored Range and is sending the whole file: start over
        length = response.headers.get("Content-Length")
        announced = start + int(length) if length else None
        if size is not None and announced is not None and announced != size:  # another file, not a cut
            part.unlink(missing_ok=True)
            raise DownloadError(f"{url}: the server announces {announced} bytes, expected {size}; not fetched")
        total = size or announced
        with part.open("ab" if start else "wb") as file, tqdm(
            total=total, initial=start, unit="B", unit_scale=True, desc=label, disable=None
        ) as bar:
            try:
                while chunk := response.read(CHUNK_BYTES):
                    file.write(chunk)
                    bar.update(len(chunk))
            except (http.client.IncompleteRead, OSError) as error:
                raise CutTransfer(f"connection lost at {part.stat().st_size} bytes ({type(error).__name__})") from None
    received = part.stat().st_size
    if total is not None and received < total:
        raise CutTransfer(f"connection closed at {received} of {total} bytes")
    return total or received


def fetch(url: str, target: Path, size: int | None, *, timeout: float = 30.0, attempts: int = 3,
          retry_wait: float = 2.0) -> Path:
    """Download ``url`` to ``target`` through ``target.part``, resuming cut transfers; returns ``target``."""
    if target.exists():
        return target  # fetched by an earlier run whose extraction failed; verify() checks it again
    part = target.with_name(target.name + ".part")
    if size is not None and part.exists() and part.stat().st_size > size:
        part.unlink()  # longer than the published file: not a prefix of it
    for attempt in range(1, attempts + 1):
        if size is not None and part.exists() and part.stat().st_size == size:
            break  # complete from an earlier run that stopped before the rename
        try:
            _transfer(url, part, size, timeout=timeout, label=target.name)
            break
        except CutTransfer as cut:
            if attempt == attempts:
                raise DownloadError(f"{url}: {cut}; run the command again to resume") from None
            print(f"{target.name}: {cut}; resuming ({attempt}/{attempts - 1})", file=sys.stderr)
            time.sleep(retry_wait)
    part.replace(target)
    return target


def _md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as file:
        while chunk := file.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


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


def verify(path: Path, archive: Archive, url: str) -> None:
    """Size and MD5 where published, then the zip's own CRCs; a file that fails is deleted."""
    size = path.stat().st_size
    problem = None
    if archive.exact_size and size != archive.size:
        problem = f"{size} bytes, expected {archive.size}"
    elif archive.md5 and (digest := _md5(path)) != archive.md5:
        problem = f"MD5 {digest}, expected {archive.md5}"
    else:
        problem = _zip_problem(path)
    if problem:
        path.unlink()
        raise DownloadError(f"{path} (from {url}): {problem}; deleted it, run the command again to fetch it anew")


def extract(path: Path, destination: Path, root: Path) -> None:
    """Unpack ``path`` into ``destination`` all at once: into a temporary folder in ``root``, then rename."""
    staging = Path(tempfile.mkdtemp(prefix=f".{path.stem}-", suffix=".extracting", dir=root))
    created = not destination.exists()
    try:
        with zipfile.ZipFile(path) as archive:
            archive.extractall(staging)
        entries = sorted(staging.iterdir())
        clashes = [entry.name for entry in entries if (destination / entry.name).exists()]
        if clashes:
            raise DownloadError(f"{path}: {destination / clashes[0]} already exists; move it away and run again")
        destination.mkdir(parents=True, exist_ok=True)
        for entry in entries:  # renames within one filesystem: each entry appears whole or not at all
            entry.rename(destination / entry.name)
    except (OSError, zipfile.BadZipFile) as error:
        if created and destination.is_dir() and not any(destination.iterdir()):
            destination.rmdir()
        raise DownloadError(f"{path}: extraction into {destination} failed ({error})") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


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
             timeout: float = 30.0, attempts: int = 3, retry_wait: float = 2.0) -> Path:
    """Fetch, verify and extract what ``dataset`` still lacks under ``root``; returns the dataset folder."""
    spec = DOWNLOADS[dataset] if isinstance(dataset, str) else dataset
    root.mkdir(parents=True, exist_ok=True)
    destination = root / spec.extract_to
    if destination.is_dir():
        convert(spec, destination)  # finishes what an interrupted run extracted but did not convert
    for archive in spec.missing(root, split):
        url = archive_url(archive, base_url)
        approx = "" if archive.exact_size else "about "
        print(f"{spec.name}: fetching {url} ({approx}{human_size(archive.size)}) into {root}")
        path = fetch(url, root / archive.filename, archive.size if archive.exact_size else None,
                     timeout=timeout, attempts=attempts, retry_wait=retry_wait)
        verify(path, archive, url)
        extract(path, destination, root)
        path.unlink()  # the extracted files are what training reads; the zip would double the disk use
        convert(spec, destination)
    folder = root / spec.folder_name
    print(f"{spec.name}: ready in {folder} ({prove(spec, root, split)})")
    return folder
