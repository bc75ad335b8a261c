"""Fetching one file over https: resumed with ``Range``, capped in bytes, one download of a file at a time.

The transport half of :mod:`detector.data.download` (datasets) and :mod:`detector.weights.download` (weights):

- https only (``allow_http`` / ``--allow-http`` lets plain http through, redirects included);
- never more bytes than the caller allows, whatever the server announces, counted as they arrive;
- a cut transfer resumes with an HTTP ``Range`` request into ``<file>.part`` (a server that ignores ``Range`` and
  sends the whole file restarts it, and is not promised a resume);
- :func:`one_download` holds ``<name>.lock`` (:mod:`detector.data.lock`): a second download of the same file stops
  at once, naming the first one's pid, instead of truncating its ``.part``;
- :func:`digest_problem` checks the whole file, resumed or not, against a pinned SHA-256 (or a published MD5).

``$DETECTOR_DOWNLOAD_URL`` (or ``base_url``) fetches every file from ``<base>/<file name>`` instead: a mirror, or a
local server in the tests. docs/security.md has the policy.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tqdm import tqdm

from detector.data.catalog import human_size
from detector.data.lock import Busy, exclusive

BASE_URL_ENV = "DETECTOR_DOWNLOAD_URL"
CHUNK_BYTES = 1 << 20


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



def check_transport(url: str, *, allow_http: bool = False) -> None:
    """https, or http when ``allow_http`` says so; anything else (ftp, file, ...) is refused in one line."""
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme == "https" or (scheme == "http" and allow_http):
        return
    if scheme == "http":
        raise DownloadError(f"{url}: plain http refused (anyone on the way could swap the file); use an https URL, "
                            "or pass --allow-http (the same checks apply to what arrives)")
    what = scheme or "a bare path"
    raise DownloadError(f"{url}: only https (or http with --allow-http) URLs are fetched, not {what}")


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
