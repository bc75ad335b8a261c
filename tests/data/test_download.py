"""End-to-end downloads from a real HTTP server on 127.0.0.1 (Range support, cut transfers, bad archives).

Nothing here can hang: the client uses a 5 s socket timeout, and the server thread is joined with a timeout.
"""

from __future__ import annotations

import hashlib
import io
import os
import socket
import struct
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import cv2
import numpy as np
import pytest

from detector.cli import download as download_command
from detector.data import download as downloader
from detector.data import lock, transfer
from detector.data.catalog import DOWNLOADS, Download
from detector.data.download import download
from detector.data.spec import load_dataset_spec
from detector.data.transfer import DownloadError, _CheckedRedirects, check_transport
from detector.data.synthetic import make_image, write_yolo_split
from tests.conftest import voc_xml, write_voc_devkit

TIMEOUT_S = 5.0


@dataclass
class Served:
    """What the server holds and how it misbehaves; ``requests`` records each (path, Range header)."""

    files: dict[str, bytes] = field(default_factory=dict)
    cut_first: bool = False  # close the first response to each file halfway through its body
    cut_all: bool = False  # close every response halfway through its body
    ignore_range: bool = False
    no_length: bool = False  # send no Content-Length: the client cannot know the size in advance
    redirects: dict[str, str] = field(default_factory=dict)  # name -> Location of a 302
    hold_first: threading.Event | None = None  # the first response to each file sends half, then waits for this
    requests: list[tuple[str, str | None]] = field(default_factory=list)


def _handler(served: Served) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            name = self.path.lstrip("/")
            first = all(path != name for path, _ in served.requests)
            served.requests.append((name, self.headers.get("Range")))
            if name in served.redirects:
                self.send_response(302)
                self.send_header("Location", served.redirects[name])
                self.end_headers()
                return
            body = served.files.get(name)
            if body is None:
                self.send_error(404)
                return
            start = 0
            if self.headers.get("Range") and not served.ignore_range:
                start = int(self.headers["Range"].removeprefix("bytes=").rstrip("-"))
                if start >= len(body):
                    self.send_error(416)
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
            else:
                self.send_response(200)
            if not served.no_length:
                self.send_header("Content-Length", str(len(body) - start))
            self.end_headers()
            if served.hold_first is not None and first:
                self.wfile.write(body[start:start + len(body) // 2])
                self.wfile.flush()
                served.hold_first.wait(TIMEOUT_S)
                self.wfile.write(body[start + len(body) // 2:])
                return
            if (served.cut_first and first) or served.cut_all:
                self.wfile.write(body[start:start + len(body) // 2])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(body[start:])

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@pytest.fixture
def server() -> Iterator[tuple[str, Served]]:
    served = Served()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(served))
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", served
    httpd.shutdown()
    httpd.server_close()
    thread.join(TIMEOUT_S)
    assert not thread.is_alive()


def coco128_zip(tmp_path: Path) -> bytes:
    """A tiny dataset in coco128.zip's layout: coco128/{images,labels}/train2017 (stored, so cuts land mid-file)."""
    source = tmp_path / "zip-source" / "coco128"
    write_yolo_split(source, "train2017", 6, 64, 0)
    return stored_zip(source, names_from=source.parent)


def stored_zip(source: Path, *, names_from: Path) -> bytes:
    """Every file under ``source`` in an uncompressed zip (so cuts and flipped bytes land in file data),
    named by its path below ``names_from``."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for path in sorted(source.rglob("*")):
            archive.write(path, path.relative_to(names_from).as_posix())
    return buffer.getvalue()


def corrupt_first_jpeg(body: bytes) -> tuple[bytes, str]:
    """``body`` (a stored zip) with one byte of its first JPEG's data flipped, and that member's name."""
    changed = bytearray(body)
    member = next(m for m in zipfile.ZipFile(io.BytesIO(body)).infolist() if m.filename.endswith(".jpg"))
    name_length, extra_length = struct.unpack("<HH", changed[member.header_offset + 26:member.header_offset + 30])
    changed[member.header_offset + 30 + name_length + extra_length + 10] ^= 0xFF  # a byte of its (stored) data
    return bytes(changed), member.filename


def fetch_options(base: str) -> dict:
    """The local server speaks plain http: allowed here, as ``--allow-http`` would."""
    return {"base_url": base, "timeout": TIMEOUT_S, "retry_wait": 0.0, "allow_http": True}


def assert_nothing_extracted(root: Path) -> None:
    """No dataset folder, no staging folder, no zip (a corrupt download is deleted)."""
    assert not root.exists() or sorted(p.name for p in root.iterdir()) == []


def test_cut_transfer_resumes_with_range_and_the_yaml_loads(tmp_path: Path, server: tuple[str, Served]):
    base, served = server
    served.files["coco128.zip"] = coco128_zip(tmp_path)
    served.cut_first = True
    root = tmp_path / "datasets"
    folder = download("coco128", root=root, **fetch_options(base))
    assert folder == root / "coco128" and len(list((folder / "images/train2017").iterdir())) == 6
    size = len(served.files["coco128.zip"])
    assert served.requests == [("coco128.zip", None), ("coco128.zip", f"bytes={size // 2}-")]
    assert sorted(p.name for p in root.iterdir()) == ["coco128"]  # no .part, no zip, no staging folder
    download("coco128", root=root, **fetch_options(base))  # already there: nothing fetched again
    assert len(served.requests) == 2


def test_a_server_that_ignores_range_restarts_the_file(tmp_path: Path, server: tuple[str, Served],
                                                       capsys: pytest.CaptureFixture):
    base, served = server
    served.files["coco128.zip"] = coco128_zip(tmp_path)
    served.cut_first = served.ignore_range = True
    root = tmp_path / "datasets"
    download("coco128", root=root, **fetch_options(base))
    assert (root / "coco128/labels/train2017").is_dir() and len(served.requests) == 2
    assert "coco128.zip: the server does not support resuming" in capsys.readouterr().err


def test_a_server_that_ignores_range_is_not_promised_a_resume(tmp_path: Path, server: tuple[str, Served],
                                                              capsys: pytest.CaptureFixture):
    """The log said "resuming" and the last line "run the command again to resume": neither could happen."""
    base, served = server
    served.files["coco128.zip"] = coco128_zip(tmp_path)
    served.cut_all = served.ignore_range = True
    with pytest.raises(DownloadError) as error:
        download("coco128", root=tmp_path / "datasets", **{**fetch_options(base), "attempts": 3})
    message = str(error.value)
    assert "\n" not in message and "to resume" not in message
    assert message.endswith("run the command again (this server cannot resume: each try starts over)")
    err = capsys.readouterr().err
    size = len(served.files["coco128.zip"])
    assert f"the server does not support resuming (it sent the whole file for bytes={size // 2}-); " \
           "restarting from the start" in err
    assert "resuming (1/2)" in err and "starting over (2/2)" in err  # the first try could not know yet


def test_a_partial_file_from_an_earlier_run_is_resumed(tmp_path: Path, server: tuple[str, Served]):
    base, served = server
    body = coco128_zip(tmp_path)
    served.files["coco128.zip"] = body
    root = tmp_path / "datasets"
    root.mkdir()
    (root / "coco128.zip.part").write_bytes(body[:1000])
    download("coco128", root=root, **fetch_options(base))
    assert served.requests == [("coco128.zip", "bytes=1000-")] and (root / "coco128/images/train2017").is_dir()


@pytest.mark.usefixtures("watchdog")
def test_a_second_download_of_the_same_dataset_stops_at_once_and_the_first_completes(tmp_path: Path,
                                                                                      server: tuple[str, Served]):
    """The second used to truncate the first's .part: both failed (a CRC error, a vanished .part)."""
    base, served = server
    served.files["coco128.zip"] = coco128_zip(tmp_path)
    served.hold_first = threading.Event()
    root = tmp_path / "datasets"
    outcome: list[object] = []
    first = threading.Thread(target=lambda: outcome.append(download("coco128", root=root, **fetch_options(base))))
    first.start()
    try:
        part = root / "coco128.zip.part"
        for _ in range(int(TIMEOUT_S / 0.01)):  # until the first is in its transfer (held halfway by the server)
            if part.exists():
                break
            threading.Event().wait(0.01)
        with pytest.raises(DownloadError) as error:
            download("coco128", root=root, **fetch_options(base))
    finally:
        served.hold_first.set()
        first.join(TIMEOUT_S)
    message = str(error.value)
    assert "\n" not in message and f"another download of coco128 into {root} is running (pid {os.getpid()})" in message
    assert outcome == [root / "coco128"] and len(served.requests) == 1
    assert sorted(p.name for p in root.iterdir()) == ["coco128"]  # no lock file, .part or zip left
    assert len(load_dataset_spec("coco128.yaml", datasets_dir=root).train.images) == 6


def test_a_lock_left_by_a_killed_download_locks_nothing(tmp_path: Path, server: tuple[str, Served]):
    base, served = server
    served.files["coco128.zip"] = coco128_zip(tmp_path)
    root = tmp_path / "datasets"
    root.mkdir()
    (root / "coco128.lock").write_text("999999\n")  # its process is gone: the kernel dropped its flock
    download("coco128", root=root, **fetch_options(base))
    assert sorted(p.name for p in root.iterdir()) == ["coco128"]
    with lock.exclusive(root / "coco128.lock"), pytest.raises(lock.Busy):
        with lock.exclusive(root / "coco128.lock"):
            pass


def test_a_part_file_deleted_by_another_program_is_one_line(tmp_path: Path, server: tuple[str, Served],
                                                           monkeypatch: pytest.MonkeyPatch):
    base, served = server
    served.files["coco128.zip"] = coco128_zip(tmp_path)
    original = transfer._transfer

    def then_deleted(url: str, part: Path, *args: object, **kwargs: object) -> int:
        total = original(url, part, *args, **kwargs)
        part.unlink()
        return total

    monkeypatch.setattr(transfer, "_transfer", then_deleted)
    root = tmp_path / "datasets"
    with pytest.raises(DownloadError, match="coco128.zip.part: deleted while it was being written") as error:
        download("coco128", root=root, **fetch_options(base))
    assert "\n" not in str(error.value)


def test_checksum_mismatch_is_refused_in_one_line_and_nothing_is_extracted(tmp_path: Path, server: tuple[str, Served]):
    base, served = server
    body = coco128_zip(tmp_path)
    served.files["coco128.zip"] = body
    archive = replace(DOWNLOADS["coco128"].archives[0], size=len(body), exact_size=True, md5="0" * 32)
    dataset = replace(DOWNLOADS["coco128"], archives=(archive,))
    root = tmp_path / "datasets"
    with pytest.raises(DownloadError) as error:
        download(dataset, root=root, **fetch_options(base))
    message = str(error.value)
    assert "\n" not in message and "coco128.zip" in message and "MD5" in message
    assert hashlib.md5(body).hexdigest() in message
    assert_nothing_extracted(root)


def test_corrupt_zip_is_refused_in_one_line_and_nothing_is_extracted(tmp_path: Path, server: tuple[str, Served],
                                                                     capsys: pytest.CaptureFixture):
    base, served = server
    served.files["coco128.zip"], corrupted = corrupt_first_jpeg(coco128_zip(tmp_path))
    root = tmp_path / "datasets"
    with pytest.raises(DownloadError) as error:
        download("coco128", root=root, **fetch_options(base))
    message = str(error.value)
    assert "\n" not in message and "CRC" in message and corrupted in message and base in message
    assert_nothing_extracted(root)
    assert "no digest is pinned" not in capsys.readouterr().err  # not accepted, so no SHA-256 to trust


def test_a_zip_already_in_the_root_that_fails_is_kept(tmp_path: Path, server: tuple[str, Served]):
    """Not fetched by this run (put there by hand, perhaps): refused in one line, never deleted."""
    base, served = server
    body, corrupted = corrupt_first_jpeg(coco128_zip(tmp_path))
    root = tmp_path / "datasets"
    root.mkdir()
    (root / "coco128.zip").write_bytes(body)
    with pytest.raises(DownloadError) as error:
        download("coco128", root=root, **fetch_options(base))
    message = str(error.value)
    assert "\n" not in message and corrupted in message
    assert "it was there before this run, so it is left as it is: move it away" in message
    assert (root / "coco128.zip").read_bytes() == body and served.requests == []


def test_a_zip_with_another_top_folder_is_refused_before_extraction_and_kept(tmp_path: Path,
                                                                              server: tuple[str, Served],
                                                                              capsys: pytest.CaptureFixture):
    """coco128-main/ instead of coco128/: it used to be extracted, deleted, and the same command suggested again."""
    base, served = server
    source = tmp_path / "zip-source" / "coco128-main"
    write_yolo_split(source, "train2017", 2, 64, 0)
    served.files["coco128.zip"] = stored_zip(source, names_from=source.parent)
    root = tmp_path / "datasets"
    with pytest.raises(DownloadError) as error:
        download("coco128", root=root, **fetch_options(base))
    message = str(error.value)
    assert "\n" not in message and str(root / "coco128.zip") in message
    assert "holds coco128-main at its top level, not coco128" in message and "kept it" in message
    assert sorted(p.name for p in root.iterdir()) == ["coco128.zip"]  # nothing extracted, no staging folder
    assert "no digest is pinned" not in capsys.readouterr().err  # refused: no SHA-256 offered to trust


def test_a_zip_s_extra_top_level_entries_are_not_extracted_into_the_shared_root(tmp_path: Path,
                                                                                server: tuple[str, Served],
                                                                                capsys: pytest.CaptureFixture):
    """coco128 extracts into the datasets root itself: a __MACOSX/ or README.txt beside coco128/ landed there, and the
    next download of a zip holding the same name (coco128 again, once its folder was moved away) refused to run."""
    base, served = server
    source = tmp_path / "zip-source"
    write_yolo_split(source / "coco128", "train2017", 2, 64, 0)
    (source / "__MACOSX").mkdir()
    (source / "__MACOSX" / "._coco128").write_bytes(b"x")
    (source / "README.txt").write_text("about coco128")
    served.files["coco128.zip"] = stored_zip(source, names_from=source)
    root = tmp_path / "datasets"
    download("coco128", root=root, **fetch_options(base))
    assert sorted(p.name for p in root.iterdir()) == ["coco128"]
    assert "note: coco128: not extracted from coco128.zip, which coco128 does not read: README.txt, __MACOSX" \
        in capsys.readouterr().err.splitlines()
    (root / "coco128").rename(tmp_path / "moved-away")
    download("coco128", root=root, **fetch_options(base))  # fetched and extracted again: nothing in the way
    assert sorted(p.name for p in root.iterdir()) == ["coco128"]


def test_failed_extraction_leaves_nothing_half_extracted(tmp_path: Path, server: tuple[str, Served],
                                                         monkeypatch: pytest.MonkeyPatch):
    base, served = server
    served.files["coco128.zip"] = coco128_zip(tmp_path)
    calls = []

    def fail_on_third(*args: object) -> None:
        calls.append(args)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return original(*args)

    original = downloader._copy_member  # what extract() calls for each member
    monkeypatch.setattr(downloader, "_copy_member", fail_on_third)
    root = tmp_path / "datasets"
    with pytest.raises(DownloadError, match="No space left") as error:
        download("coco128", root=root, **fetch_options(base))
    assert "\n" not in str(error.value)
    assert sorted(p.name for p in root.iterdir()) == ["coco128.zip"]  # verified zip kept; no partial folder
    monkeypatch.undo()
    download("coco128", root=root, **fetch_options(base))  # the kept zip is verified and extracted, not fetched
    assert len(served.requests) == 1 and sorted(p.name for p in root.iterdir()) == ["coco128"]


def test_staging_folders_left_by_a_killed_extraction_are_removed_at_the_next_start(
        tmp_path: Path, server: tuple[str, Served], capsys: pytest.CaptureFixture):
    base, served = server
    served.files["coco128.zip"] = coco128_zip(tmp_path)
    root = tmp_path / "datasets"
    (root / ".coco128-k1ll3d_x.extracting/coco128/images").mkdir(parents=True)
    (root / ".val2017-k1ll3d_x.extracting").mkdir()  # another dataset's: its own download cleans it
    download("coco128", root=root, **fetch_options(base))
    assert sorted(p.name for p in root.iterdir()) == [".val2017-k1ll3d_x.extracting", "coco128"]
    removed = f"removed {root / '.coco128-k1ll3d_x.extracting'}, left by an interrupted extraction"
    assert removed in capsys.readouterr().err


# Run as a command; its second zip member's extraction is met by a SIGTERM (kill, docker stop, a job's time limit).
SIGTERM_DURING_EXTRACTION = """
import os, signal, sys
from detector.cli import download as command
from detector.data import download as downloader
original, calls = downloader._copy_member, []
def then_terminated(*args):
    calls.append(args)
    if len(calls) == 2:
        os.kill(os.getpid(), signal.SIGTERM)
    return original(*args)
downloader._copy_member = then_terminated
sys.exit(command.main(sys.argv[1:]))
"""


def test_sigterm_during_extraction_unwinds_like_ctrl_c_and_leaves_no_staging_folder(tmp_path: Path,
                                                                                    server: tuple[str, Served]):
    """SIGTERM used to kill the command outright: a hidden .coco128-*.extracting stayed in the root for ever."""
    base, served = server
    served.files["coco128.zip"] = coco128_zip(tmp_path)
    root = tmp_path / "datasets"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), transfer.BASE_URL_ENV: base}
    done = subprocess.run([sys.executable, "-c", SIGTERM_DURING_EXTRACTION, "coco128", "--datasets-dir", str(root),
                           "--allow-http"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 143, (done.returncode, done.stderr[-2000:])  # 128 + SIGTERM, not Ctrl-C's 130
    assert "error: terminated (SIGTERM); run the command again to resume" in done.stderr
    assert sorted(p.name for p in root.iterdir()) == ["coco128.zip"]  # the verified zip: no staging folder, no lock


def test_unreachable_host_is_named_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture,
                                               monkeypatch: pytest.MonkeyPatch):
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv(transfer.BASE_URL_ENV, f"http://127.0.0.1:{port}")
    code = download_command.main(["coco128", "--datasets-dir", str(tmp_path / "datasets"), "--allow-http"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1, lines
    assert f"http://127.0.0.1:{port}/coco128.zip" in lines[0] and "cannot connect" in lines[0]


def test_a_server_that_connects_but_never_answers_is_not_called_unreachable(tmp_path: Path):
    """It said "cannot connect (timed out)", though it had connected."""
    with socket.socket() as silent:  # the kernel accepts the connection into the backlog; nothing ever answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        base = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(DownloadError) as error:
            download("coco128", root=tmp_path / "datasets", **{**fetch_options(base), "timeout": 0.5})
    assert str(error.value) == f"{base}/coco128.zip: connected, but no answer in 0.5 s"


def test_a_missing_file_is_named_with_its_http_status(tmp_path: Path, server: tuple[str, Served]):
    base, _ = server
    with pytest.raises(DownloadError, match=f"{base}/coco128.zip: HTTP 404"):
        download("coco128", root=tmp_path / "datasets", **fetch_options(base))


def test_coco_val_split_fetches_annotations_and_val_only(tmp_path: Path, server: tuple[str, Served]):
    """The real COCO catalogue entry, with its sizes/MD5s swapped for the small archives served here."""
    base, served = server
    rng = np.random.default_rng(0)
    images = tmp_path / "val2017"
    images.mkdir()
    image, _ = make_image(rng, 32)
    cv2.imwrite(str(images / "000000000001.jpg"), image)
    instances = ('{"images": [{"id": 1, "file_name": "000000000001.jpg", "width": 32, "height": 32}], '
                 '"annotations": [], "categories": [{"id": 1, "name": "person"}]}')
    archives = []
    for archive, members in zip(DOWNLOADS["coco"].archives, (
        {"annotations/instances_val2017.json": instances.encode()},
        {"val2017/000000000001.jpg": (images / "000000000001.jpg").read_bytes()},
        {"train2017/x.jpg": b"never fetched"},
    )):
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as bundle:
            for name, data in members.items():
                bundle.writestr(name, data)
        served.files[archive.filename] = buffer.getvalue()
        archives.append(replace(archive, size=len(buffer.getvalue()), md5=hashlib.md5(buffer.getvalue()).hexdigest()))
    dataset = replace(DOWNLOADS["coco"], archives=tuple(archives))
    root = tmp_path / "datasets"
    folder = download(dataset, root=root, split="val", **fetch_options(base))
    assert sorted(p.name for p in folder.iterdir()) == ["annotations", "val2017"]
    assert [path for path, _ in served.requests] == ["annotations_trainval2017.zip", "val2017.zip"]


# What the served VOC zips hold, and the labels the conversion must write for them (64x48 images).
VOC_SETS = {
    "VOCtrainval_06-Nov-2007.zip": ("2007", "trainval", {
        "000005": [("chair", 1, 1, 32, 24, 0), ("person", 5, 5, 20, 20, 1), ("car", 11, 5, 40, 44, 0)],
        "000007": [("person", 1, 1, 64, 48, 1)],
    }),
    "VOCtest_06-Nov-2007.zip": ("2007", "test", {"000001": [("cat", 1, 1, 64, 48, 0)]}),
    "VOCtrainval_11-May-2012.zip": ("2012", "trainval", {
        "2008_000002": [("tvmonitor", 33, 25, 64, 48, 0), ("unicorn", 1, 1, 10, 10, 0)],
    }),
}
VOC_LABELS = {
    "trainval2007/000005.txt": "8 0.250000 0.250000 0.500000 0.500000\n6 0.390625 0.500000 0.468750 0.833333\n",
    "trainval2007/000007.txt": "",  # its one object is difficult
    "test2007/000001.txt": "7 0.500000 0.500000 1.000000 1.000000\n",
    "trainval2012/2008_000002.txt": "19 0.750000 0.750000 0.500000 0.500000\n",  # the unicorn is no VOC class
}


def voc_zips(tmp_path: Path) -> dict[str, bytes]:
    """Tiny zips in the layout of the VOC zips Ultralytics publishes: VOCdevkit/VOC<year>/... (stored)."""
    zips = {}
    for filename, (year, image_set, objects) in VOC_SETS.items():
        source = tmp_path / "zip-source" / filename
        write_voc_devkit(source, year, image_set, {i: voc_xml(objs) for i, objs in objects.items()})
        zips[filename] = stored_zip(source, names_from=source)
    return zips


def test_voc_downloads_converts_to_yolo_labels_and_loads(tmp_path: Path, server: tuple[str, Served],
                                                         capsys: pytest.CaptureFixture,
                                                         monkeypatch: pytest.MonkeyPatch):
    base, served = server
    served.files.update(voc_zips(tmp_path))
    monkeypatch.setenv(transfer.BASE_URL_ENV, base)
    root = tmp_path / "datasets"
    assert download_command.main(["voc", "--datasets-dir", str(root), "--allow-http"]) == 0
    folder = root / "VOC"
    assert sorted(p.name for p in root.iterdir()) == ["VOC"]  # no zip, no devkit, no staging folder left
    assert sorted(p.name for p in folder.iterdir()) == ["images", "labels"]
    labels = {p.relative_to(folder / "labels").as_posix(): p.read_text()
              for p in sorted((folder / "labels").rglob("*.txt"))}
    assert labels == VOC_LABELS
    images = sorted(p.relative_to(folder / "images").as_posix() for p in (folder / "images").rglob("*.jpg"))
    assert images == sorted(label.replace(".txt", ".jpg") for label in VOC_LABELS)
    captured = capsys.readouterr()
    unpinned = [line for line in captured.err.splitlines() if "no digest is pinned" in line]
    assert len(unpinned) == 3 and all("its SHA-256 is" in line for line in unpinned)  # VOC has no pinned digest
    warnings = [line for line in captured.err.splitlines() if line.startswith("warning:") and line not in unpinned]
    assert len(warnings) == 1 and "2008_000002.xml" in warnings[0] and "'unicorn'" in warnings[0]
    assert "VOC.yaml loads: 20 classes" in captured.out
    spec = load_dataset_spec("VOC.yaml", datasets_dir=root)
    assert [p.name for p in spec.train.images] == ["000005.jpg", "000007.jpg", "2008_000002.jpg"]
    assert [p.name for p in spec.val.images] == ["000001.jpg"]
    before = {p: p.stat().st_mtime_ns for p in folder.rglob("*")}
    assert download_command.main(["VOC.yaml", "--datasets-dir", str(root), "--allow-http"]) == 0  # again: nothing to do
    assert len(served.requests) == 3 and {p: p.stat().st_mtime_ns for p in folder.rglob("*")} == before


def test_voc_val_split_fetches_the_2007_test_zip_only(tmp_path: Path, server: tuple[str, Served]):
    base, served = server
    served.files.update(voc_zips(tmp_path))
    root = tmp_path / "datasets"
    download("voc", root=root, split="val", **fetch_options(base))
    assert [path for path, _ in served.requests] == ["VOCtest_06-Nov-2007.zip"]
    assert sorted(p.name for p in (root / "VOC/labels").iterdir()) == ["test2007"]


def test_a_corrupt_voc_zip_is_refused_in_one_line_and_nothing_is_extracted(tmp_path: Path, server: tuple[str, Served],
                                                                            capsys: pytest.CaptureFixture,
                                                                            monkeypatch: pytest.MonkeyPatch):
    base, served = server
    served.files.update(voc_zips(tmp_path))
    served.files["VOCtrainval_06-Nov-2007.zip"], corrupted = corrupt_first_jpeg(served.files["VOCtrainval_06-Nov-2007.zip"])
    monkeypatch.setenv(transfer.BASE_URL_ENV, base)
    root = tmp_path / "datasets"
    assert download_command.main(["voc", "--datasets-dir", str(root), "--allow-http"]) == 1
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and "CRC" in lines[0] and corrupted in lines[0], lines  # no warning for the refused zip
    assert_nothing_extracted(root)


def test_a_devkit_left_by_an_interrupted_run_is_converted_without_fetching(tmp_path: Path,
                                                                           server: tuple[str, Served]):
    base, served = server
    served.files.update(voc_zips(tmp_path))
    root = tmp_path / "datasets"
    download("voc", root=root, split="val", **fetch_options(base))
    write_voc_devkit(root / "VOC", "2007", "trainval", {"000005": voc_xml([("cat", 1, 1, 64, 48, 0)])})
    download("voc", root=root, **fetch_options(base))  # converts the devkit, then fetches only the 2012 zip
    assert [path for path, _ in served.requests] == ["VOCtest_06-Nov-2007.zip", "VOCtrainval_11-May-2012.zip"]
    assert (root / "VOC/labels/trainval2007/000005.txt").read_text() == "7 0.500000 0.500000 1.000000 1.000000\n"


def test_a_conversion_that_fails_is_one_line_and_the_next_run_finishes_it(tmp_path: Path, server: tuple[str, Served]):
    base, served = server
    served.files.update(voc_zips(tmp_path))

    def no_space(folder: Path) -> None:
        raise OSError(28, "No space left on device")

    root = tmp_path / "datasets"
    with pytest.raises(DownloadError, match="converting voc failed .*No space left") as error:
        download(replace(DOWNLOADS["voc"], convert=no_space), root=root, split="val", **fetch_options(base))
    assert "\n" not in str(error.value) and (root / "VOC/VOCdevkit/VOC2007/ImageSets/Main/test.txt").is_file()
    download("voc", root=root, split="val", **fetch_options(base))  # converts the extracted devkit: no fetch
    assert len(served.requests) == 1 and (root / "VOC/labels/test2007/000001.txt").is_file()


# ------------------------------------------------------------------------------------------------ trust
def pinned_coco128(body: bytes, **changes: object) -> Download:
    """coco128's catalogue entry with ``body``'s exact size and SHA-256 pinned (as the weights are)."""
    fields = {"size": len(body), "exact_size": True, "sha256": hashlib.sha256(body).hexdigest(), **changes}
    return replace(DOWNLOADS["coco128"], archives=(replace(DOWNLOADS["coco128"].archives[0], **fields),))


def test_plain_http_is_refused_unless_allowed(tmp_path: Path, server: tuple[str, Served]):
    base, served = server
    served.files["coco128.zip"] = coco128_zip(tmp_path)
    root = tmp_path / "datasets"
    with pytest.raises(DownloadError, match="plain http refused .* --allow-http") as error:
        download("coco128", root=root, **{**fetch_options(base), "allow_http": False})
    assert "\n" not in str(error.value) and served.requests == [] and not any(root.iterdir())
    with pytest.raises(DownloadError, match="only https"):
        check_transport("file:///etc/passwd")
    check_transport("https://example.org/a.zip")  # accepted without a flag


def test_a_redirect_to_another_scheme_is_not_followed(tmp_path: Path, server: tuple[str, Served]):
    base, served = server
    served.redirects["coco128.zip"] = "ftp://127.0.0.1/coco128.zip"
    with pytest.raises(DownloadError, match="ftp://127.0.0.1/coco128.zip: only https"):
        download("coco128", root=tmp_path / "datasets", **fetch_options(base))
    redirects = _CheckedRedirects(allow_http=False)
    with pytest.raises(DownloadError, match="plain http refused"):  # https -> http: the downgrade is refused
        redirects.redirect_request(None, None, 302, "Found", {}, "http://mirror.example/coco128.zip")


def test_a_pinned_sha256_that_differs_is_refused_and_the_file_deleted(tmp_path: Path, server: tuple[str, Served]):
    base, served = server
    body = coco128_zip(tmp_path)
    served.files["coco128.zip"] = body
    root = tmp_path / "datasets"
    with pytest.raises(DownloadError) as error:
        download(pinned_coco128(body, sha256="0" * 64), root=root, **fetch_options(base))
    assert f"SHA-256 {hashlib.sha256(body).hexdigest()}, expected {'0' * 64}" in str(error.value)
    assert "deleted it" in str(error.value) and "\n" not in str(error.value)
    assert_nothing_extracted(root)
    download(pinned_coco128(body), root=root, **fetch_options(base))  # the right digest: fetched and extracted
    assert sorted(p.name for p in root.iterdir()) == ["coco128"]


def test_a_resumed_download_is_verified_as_a_whole(tmp_path: Path, server: tuple[str, Served]):
    base, served = server
    body = coco128_zip(tmp_path)
    served.files["coco128.zip"] = body
    root = tmp_path / "datasets"
    root.mkdir()
    (root / "coco128.zip.part").write_bytes(b"\0" * (len(body) // 2))  # a prefix that is not the file's
    with pytest.raises(DownloadError, match="SHA-256 .* deleted it"):
        download(pinned_coco128(body), root=root, **fetch_options(base))
    assert served.requests == [("coco128.zip", f"bytes={len(body) // 2}-")]  # it was resumed, then refused whole
    assert_nothing_extracted(root)


@pytest.mark.parametrize("no_length", [False, True])
def test_bytes_fetched_are_capped_also_without_a_content_length(tmp_path: Path, server: tuple[str, Served],
                                                                no_length: bool):
    base, served = server
    body = coco128_zip(tmp_path)
    served.files["coco128.zip"], served.no_length = body, no_length
    approximate = len(body) // 5  # the catalogue's rough size; the cap is twice that, well under the body
    dataset = replace(DOWNLOADS["coco128"], archives=(replace(DOWNLOADS["coco128"].archives[0], size=approximate),))
    root = tmp_path / "datasets"
    with pytest.raises(DownloadError, match=f"more than {2 * approximate} bytes") as error:
        download(dataset, root=root, **fetch_options(base))
    assert "\n" not in str(error.value)
    assert_nothing_extracted(root)


def test_a_zip_bomb_is_not_extracted(tmp_path: Path, server: tuple[str, Served]):
    base, served = server
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as bundle:
        bundle.writestr("coco128/images/train2017/zeros.jpg", b"\0" * (20 << 20))  # 20 MB of zeros: ~20 kB zipped
    body = buffer.getvalue()
    served.files["coco128.zip"] = body
    root = tmp_path / "datasets"
    with pytest.raises(DownloadError, match=f"more than .* \\({downloader.EXTRACT_RATIO}x its size\\).*zip bomb"):
        download(pinned_coco128(body), root=root, **fetch_options(base))
    assert sorted(p.name for p in root.iterdir()) == ["coco128.zip"]  # verified zip kept, nothing unpacked


def test_extraction_counts_the_bytes_it_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The declared sizes can lie; the bytes decompressed are what the cap counts."""
    zipped = tmp_path / "a.zip"
    zipped.write_bytes(coco128_zip(tmp_path))
    declared = downloader.declared_size(zipfile.ZipFile(zipped))
    monkeypatch.setattr(downloader, "declared_size", lambda archive: 0)  # a directory that claims nothing
    monkeypatch.setattr(downloader, "EXTRACT_RATIO", declared / 2 / zipped.stat().st_size)
    with pytest.raises(DownloadError, match="zip bomb"):
        downloader.extract(zipped, tmp_path / "out", tmp_path)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".a-*"))


def small_set_zip(tmp_path: Path, folder: str, *, flat: bool, extras: tuple[str, ...] = ()) -> bytes:
    """A tiny dataset in the layout of Ultralytics' small-set zips: ``<folder>/{images,labels}/{train,val}``, or with
    ``flat`` the same ``images/`` and ``labels/`` at the zip's top level; ``extras``: top-level files beside them."""
    source = tmp_path / "zip-source"
    dataset = source if flat else source / folder
    write_yolo_split(dataset, "train", 3, 64, 0)
    write_yolo_split(dataset, "val", 2, 64, 1)
    for name in extras:
        (source / name).write_text("not read by the dataset")
    return stored_zip(source, names_from=source)


@pytest.mark.parametrize("flat", [False, True], ids=["top-folder", "flat"])
def test_coco8_downloads_from_either_zip_layout_and_its_yaml_loads(tmp_path: Path, server: tuple[str, Served],
                                                                  capsys: pytest.CaptureFixture, flat: bool):
    """Ultralytics' unzip takes a zip with one top folder as it is and unpacks any other into a folder named after
    the zip; which form its assets have could not be seen from here, so both must end in <root>/coco8."""
    base, served = server
    served.files["coco8.zip"] = small_set_zip(tmp_path, "coco8", flat=flat, extras=("data.yaml",))
    root = tmp_path / "datasets"
    folder = download("coco8", root=root, **fetch_options(base))
    assert folder == root / "coco8" and sorted(p.name for p in root.iterdir()) == ["coco8"]  # no zip, no staging
    assert sorted(p.name for p in folder.iterdir()) == ["images", "labels"]
    spec = load_dataset_spec("coco8.yaml", datasets_dir=root)
    assert spec.num_classes == 80 and spec.names[0] == "person"
    assert len(spec.train.images) == 3 and len(spec.val.images) == 2
    assert all(Path(image).is_relative_to(root / "coco8/images/train") for image in spec.train.images)
    out, err = capsys.readouterr()
    assert ("coco8.zip holds images, labels at its top level: unpacking them into" in out) == flat
    assert "not extracted from coco8.zip, which coco8 does not read: data.yaml" in err
    download("coco8", root=root, **fetch_options(base))  # already there: nothing fetched again
    assert len(served.requests) == 1


def test_homeobjects_downloads_into_ultralytics_folder_name(tmp_path: Path, server: tuple[str, Served]):
    """Download name in lower case, zip and folder as Ultralytics spells them (homeobjects-3K)."""
    base, served = server
    served.files["homeobjects-3K.zip"] = small_set_zip(tmp_path, "homeobjects-3K", flat=True)
    root = tmp_path / "datasets"
    assert download("homeobjects-3k", root=root, **fetch_options(base)) == root / "homeobjects-3K"
    spec = load_dataset_spec("HomeObjects-3K", datasets_dir=root)
    assert spec.num_classes == 12 and len(spec.train.images) == 3 and len(spec.val.images) == 2


@pytest.mark.parametrize("tops", [("coco8-main/images/train/a.jpg", "coco8-main/labels/train/a.txt"),
                                  ("images/train/a.jpg", "README.txt")], ids=["other-folder", "no-labels"])
def test_a_small_set_zip_in_neither_layout_is_refused_before_extraction(tmp_path: Path, server: tuple[str, Served],
                                                                       tops: tuple[str, ...]):
    base, served = server
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as bundle:
        for name in tops:
            bundle.writestr(name, b"x")
    served.files["coco8.zip"] = buffer.getvalue()
    root = tmp_path / "datasets"
    with pytest.raises(DownloadError) as error:
        download("coco8", root=root, **fetch_options(base))
    message = str(error.value)
    held = sorted({name.split("/")[0] for name in tops})
    assert "\n" not in message and f"holds {', '.join(held)} at its top level, not coco8 (nor images, labels)" \
        in message and "kept it and extracted nothing" in message
    assert sorted(p.name for p in root.iterdir()) == ["coco8.zip"]  # no dataset folder, no staging folder


def test_a_flat_zip_is_unpacked_into_its_folder_all_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The folder a flat zip is unpacked into is staged whole: a failure leaves no <root>/coco8 half filled."""
    zipped = tmp_path / "coco8.zip"
    zipped.write_bytes(small_set_zip(tmp_path, "coco8", flat=True))
    root = tmp_path / "datasets"
    root.mkdir()
    calls = []

    def fail_on_the_second(*args: object) -> None:
        calls.append(args)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real_copy(*args)

    real_copy = downloader._copy_member
    monkeypatch.setattr(downloader, "_copy_member", fail_on_the_second)
    with pytest.raises(DownloadError, match="No space left on device"):
        downloader.extract(zipped, root, root, ["images", "labels"], "coco8")
    assert sorted(p.name for p in root.iterdir()) == []
    monkeypatch.setattr(downloader, "_copy_member", real_copy)
    downloader.extract(zipped, root, root, ["images", "labels"], "coco8")
    assert sorted(p.name for p in (root / "coco8").iterdir()) == ["images", "labels"]
