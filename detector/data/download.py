"""``python -m detector download coco|coco128|voc [--split val] [--datasets-dir D]``.

Fetch, verify, extract (convert), prove.

Downloads are explicit: nothing else in ``detector`` touches the network, and a YAML's ``download:``
entry is never run. For each archive the dataset still lacks:

1. fetch it into ``<root>/<file>.part`` with a progress bar, over https only (``allow_http`` / ``--allow-http``
   lets plain http through, redirects included) and never more bytes than the catalog allows, whatever the
   server announces; a cut transfer resumes with an HTTP ``Range`` request (a server that ignores ``Range``
   and sends the whole file restarts it);
2. verify the whole file, resumed or not, against the SHA-256 pinned in the catalog (or the MD5 COCO
   publishes; with neither, say so and print the file's SHA-256), and always zipfile's CRC test, before
   anything is extracted; a file that fails is deleted;
3. extract into a temporary folder in the datasets root, at most :data:`EXTRACT_RATIO` times the zip's size
   (a zip bomb stops there), and rename its entries into place, so a failure leaves nothing half-extracted;
   then delete the zip;
4. where the dataset has a ``convert`` step (VOC: XML -> YOLO txt, :mod:`detector.data.voc`), run it.

All of it runs under ``<root>/<name>.lock`` (:mod:`detector.data.lock`): a second download of the same dataset
stops at once, naming the first one's pid, instead of truncating its ``.part``.

It ends by loading the shipped YAML against the root, which proves the layout is what training reads.
``$DETECTOR_DOWNLOAD_URL`` (or ``base_url``) fetches every archive from ``<base>/<file name>`` instead:
a mirror, or a local server in the tests; the same digests and caps apply. docs/security.md has the policy.
"""

from __future__ import annotations

import glob
import hashlib
import http.client
import os
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from tqdm import tqdm

from detector.data.catalog import DOWNLOADS, Archive, Download, human_size, shipped_yaml_dir
from detector.data.lock import Busy, exclusive
from detector.data.spec import load_dataset_spec, load_split

BASE_URL_ENV = "DETECTOR_DOWNLOAD_URL"
CHUNK_BYTES = 1 << 20
# Unzipped bytes allowed per zipped byte. Photographs do not compress (20 coco128 JPEGs deflate 1.00x) and COCO's
# JSON deflates 3.3x (coco128's instances_train2017.json, zlib level 9); ten times leaves room for any dataset
# we ship, and stops a zip bomb (1000x and more) after a few times the archive's size.
EXTRACT_RATIO = 10
# Bytes fetched for an archive whose size the catalog knows only roughly (coco128, VOC): twice that.
APPROXIMATE_SIZE_MARGIN = 2


class DownloadError(RuntimeError):
    """A download that cannot go on; the message is one line naming the URL or file."""


class CutTransfer(Exception):
    """The connection ended before the whole body arrived; what came is kept in the ``.part`` file. ``resumable``
    is False when the server answered a Range request with the whole file: it cannot continue a ``.part``."""

    def __init__(self, message: str, *, resumable: bool = True) -> None:
        super().__init__(message)
        self.resumable = resumable


def mirrored_url(url: str, base_url: str | None = None) -> str:
    """``url``, or ``<base>/<its file name>`` when ``base_url`` or ``$DETECTOR_DOWNLOAD_URL`` names a mirror."""
    base = base_url or os.environ.get(BASE_URL_ENV)
    return f"{base.rstrip('/')}/{url.rsplit('/', 1)[-1]}" if base else url


def archive_url(archive: Archive, base_url: str | None = None) -> str:
    return mirrored_url(archive.url, base_url)


def check_transport(url: str, *, allow_http: bool = False) -> None:
    """https, or http when ``allow_http`` says so; anything else (ftp, file, ...) is refused in one line."""
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme == "https" or (scheme == "http" and allow_http):
        return
    if scheme == "http":
        raise DownloadError(f"{url}: plain http refused (anyone on the way could swap the file); use an https URL, "
                            "or pass --allow-http (the same checks apply to what arrives)")
    raise DownloadError(f"{url}: only https (or http with --allow-http) URLs are fetched, not {scheme or 'a bare path'}")


class _CheckedRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to a URL :func:`check_transport` accepts: an https link cannot fall back to http."""

    def __init__(self, allow_http: bool) -> None:
        self.allow_http = allow_http

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001 - urllib's signature
        check_transport(newurl, allow_http=self.allow_http)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _open(url: str, start: int, timeout: float, allow_http: bool = False) -> http.client.HTTPResponse:
    check_transport(url, allow_http=allow_http)
    headers = {"Range": f"bytes={start}-"} if start else {}
    opener = urllib.request.build_opener(_CheckedRedirects(allow_http))
    try:
        return opener.open(urllib.request.Request(url, headers=headers), timeout=timeout)
    except urllib.error.HTTPError as error:
        if error.code == 416 and start:  # the .part is no prefix the server can continue: start over
            return _open(url, 0, timeout, allow_http)
        raise DownloadError(f"{url}: HTTP {error.code} {error.reason}") from None
    except TimeoutError:  # raised bare while waiting for the answer; a connect timeout comes as a URLError below
        raise DownloadError(f"{url}: connected, but no answer in {timeout:g} s") from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise DownloadError(f"{url}: cannot connect ({reason})") from None


def _resumes_at(response: http.client.HTTPResponse, start: int) -> bool:
    """True when the server answered the Range request with the bytes from ``start`` on."""
    content_range = response.headers.get("Content-Range", "")
    return response.status == 206 and content_range.startswith(f"bytes {start}-")


def _too_many(url: str, part: Path, limit: int) -> DownloadError:
    part.unlink(missing_ok=True)
    return DownloadError(f"{url}: more than {limit} bytes ({human_size(limit)}), the most this file may have; "
                         "stopped and deleted what came")


def _transfer(url: str, part: Path, size: int | None, *, timeout: float, label: str, limit: int,
              allow_http: bool = False) -> int:
    """Append the rest of ``url`` to ``part``, never past ``limit`` bytes in all; returns the expected total size.
    Raises :class:`CutTransfer`, or :class:`DownloadError` when the file outgrows ``limit``."""
    start = part.stat().st_size if part.exists() else 0
    resumable = True
    with _open(url, start, timeout, allow_http) as response:
        if start and not _resumes_at(response, start):
            if response.status == 206:  # some other byte range: useless here, so start over without Range
                part.unlink()
                raise CutTransfer(f"server sent {response.headers.get('Content-Range')!r} for bytes={start}-")
            # The server ignored Range and is sending the whole file: start over, and say so (the log said
            # "resuming" while every try began again at byte 0)
            print(f"{label}: the server does not support resuming (it sent the whole file for bytes={start}-); "
                  "restarting from the start", file=sys.stderr)
            start, resumable = 0, False
        length = response.headers.get("Content-Length")
        announced = start + int(length) if length else None
        if size is not None and announced is not None and announced != size:  # another file, not a cut
            part.unlink(missing_ok=True)
            raise DownloadError(f"{url}: the server announces {announced} bytes, expected {size}; not fetched")
        if announced is not None and announced > limit:
            raise _too_many(url, part, limit)
        total = size or announced
        received = start
        with part.open("ab" if start else "wb") as file, tqdm(
            total=total, initial=start, unit="B", unit_scale=True, desc=label, disable=None
        ) as bar:
            try:
                # Counted here, not trusted from Content-Length: a server may send more than it announced, or
                # announce nothing at all.
                while chunk := response.read(min(CHUNK_BYTES, limit + 1 - received)):
                    received += len(chunk)
                    if received > limit:
                        break
                    file.write(chunk)
                    bar.update(len(chunk))
            except (http.client.IncompleteRead, OSError) as error:
                raise CutTransfer(f"connection lost at {part.stat().st_size} bytes ({type(error).__name__})",
                                  resumable=resumable) from None
        if received > limit:
            raise _too_many(url, part, limit)
    received = part.stat().st_size
    if total is not None and received < total:
        raise CutTransfer(f"connection closed at {received} of {total} bytes", resumable=resumable)
    return total or received


@contextmanager
def one_download(lock: Path, what: str) -> Iterator[None]:
    """Run the ``with`` block as the only download of ``what`` (its lock file: ``lock``); else one line, at once."""
    try:
        with exclusive(lock):
            yield
    except Busy as busy:
        pid = f" (pid {busy.pid})" if busy.pid else ""
        raise DownloadError(f"{lock}: another download of {what} is running{pid}; let it finish (or stop it), "
                            "then run the command again") from None


def fetch(url: str, target: Path, size: int | None, *, max_bytes: int | None = None, allow_http: bool = False,
          timeout: float = 30.0, attempts: int = 3, retry_wait: float = 2.0) -> Path:
    """Download ``url`` to ``target`` through ``target.part``, resuming cut transfers; returns ``target``.

    ``size``: the exact size when known (a server announcing another is refused before anything is fetched);
    ``max_bytes``: the most bytes the file may have (default ``size``; one of the two is required), counted as
    they arrive. Over https only unless ``allow_http``. The caller verifies the digest of the whole file, and holds
    :func:`one_download`'s lock: two fetches of one file would write the same ``.part``.
    """
    limit = max_bytes if max_bytes is not None else size
    if limit is None:
        raise ValueError(f"{url}: fetch needs an exact size or a byte cap")
    check_transport(url, allow_http=allow_http)
    if target.exists():
        return target  # fetched by an earlier run whose extraction failed; verify() checks it again
    part = target.with_name(target.name + ".part")
    if size is not None and part.exists() and part.stat().st_size > size:
        part.unlink()  # longer than the published file: not a prefix of it
    resumable = True  # until the server answers a Range request with the whole file
    try:
        for attempt in range(1, attempts + 1):
            if size is not None and part.exists() and part.stat().st_size == size:
                break  # complete from an earlier run that stopped before the rename
            try:
                _transfer(url, part, size, timeout=timeout, label=target.name, limit=limit, allow_http=allow_http)
                break
            except CutTransfer as cut:
                resumable = resumable and cut.resumable
                if attempt == attempts:
                    how = "to resume" if resumable else "(this server cannot resume: each try starts over)"
                    raise DownloadError(f"{url}: {cut}; run the command again {how}") from None
                again = "resuming" if resumable else "starting over"
                print(f"{target.name}: {cut}; {again} ({attempt}/{attempts - 1})", file=sys.stderr)
                time.sleep(retry_wait)
        part.replace(target)
    except FileNotFoundError:  # the lock keeps our own downloads apart; something else deleted it
        raise DownloadError(f"{part}: deleted while it was being written (by another program?); "
                            "run the command again") from None
    return target


def file_digest(path: Path, algorithm: str = "sha256") -> str:
    """Hex digest of the whole file (``sha256``, or ``md5`` for the digests COCO publishes)."""
    digest = hashlib.new(algorithm, usedforsecurity=algorithm != "md5")
    with path.open("rb") as file:
        while chunk := file.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def digest_problem(path: Path, *, sha256: str | None, md5: str | None = None) -> str | None:
    """Compare ``path`` with its pinned SHA-256 (else the published MD5); -> the mismatch, or None (also when
    neither is pinned: :func:`warn_unpinned` says so once the file has passed its other checks)."""
    if sha256:
        digest = file_digest(path)
        return None if digest == sha256.lower() else f"SHA-256 {digest}, expected {sha256.lower()}"
    if md5:
        digest = file_digest(path, "md5")
        return None if digest == md5 else f"MD5 {digest}, expected {md5}"
    return None


def warn_unpinned(path: Path) -> None:
    """One warning line for an accepted file that no digest is pinned for, with its SHA-256 to compare with a trusted
    copy. Printed only once the file is accepted: it came first for a corrupt zip about to be deleted."""
    print(f"warning: {path.name}: no digest is pinned for this file, so only its size and zip CRCs are checked; "
          f"its SHA-256 is {file_digest(path)}", file=sys.stderr)


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


def layout_problem(path: Path, archive: Archive) -> str | None:
    """What the zip's top level lacks of ``archive.provides`` (for a dataset without a ``convert`` step), or None.

    Checked before extracting: a zip with another top folder (``coco128-main/``) used to be extracted and deleted,
    after which the dataset was still missing and the hint named the same command again, for ever.
    """
    expected = sorted({PurePosixPath(entry).parts[0] for entry in archive.provides})
    with zipfile.ZipFile(path) as bundle:
        tops = sorted({PurePosixPath(name).parts[0] for name in bundle.namelist() if PurePosixPath(name).parts})
    if set(expected) <= set(tops):
        return None
    held = ", ".join(tops[:3]) + (f" and {len(tops) - 3} more" if len(tops) > 3 else "") if tops else "nothing"
    return f"holds {held} at its top level, not {', '.join(expected)}"


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


def extract(path: Path, destination: Path, root: Path) -> None:
    """Unpack ``path`` into ``destination`` all at once: into a temporary folder in ``root``, then rename.

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
                _copy_member(archive, member, staging, budget)
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
            if spec.convert is None and (problem := layout_problem(path, archive)):
                raise DownloadError(f"{path} (from {url}): {problem}, so it is not {spec.name}'s archive; kept it and "
                                    "extracted nothing: delete it, and check the mirror if one is set")
            if not archive.sha256 and not archive.md5:
                warn_unpinned(path)  # accepted now: its SHA-256 is worth comparing
            extract(path, destination, root)
            path.unlink()  # the extracted files are what training reads; the zip would double the disk use
            convert(spec, destination)
    folder = root / spec.folder_name
    print(f"{spec.name}: ready in {folder} ({prove(spec, root, split)})")
    return folder
