"""Every kind of predict source (detector/inference/sources.py): arrays, PIL images, lists, globs, nested folders,
video files, webcams and streams (through a fake capture: no device here), and the read-ahead thread."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from detector.inference import sources
from detector.inference.sources import Frame, open_source, read_ahead


def bgr(seed: int, height: int = 24, width: int = 32) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def write_video(path: Path, frames: int = 5, fps: float = 7.0) -> list[np.ndarray]:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (64, 48))
    images = [np.full((48, 64, 3), 40 * index, np.uint8) for index in range(frames)]
    for image in images:
        writer.write(image)
    writer.release()
    return images


def test_arrays_are_bgr_as_opencv_gives_them_and_pil_images_are_rgb() -> None:
    array = bgr(0)
    (frame,) = open_source(array)
    assert frame.name == "image0.jpg" and frame.index is None
    np.testing.assert_array_equal(frame.image, array[:, :, ::-1])  # BGR in, RGB out
    assert frame.image.flags["C_CONTIGUOUS"]
    (from_pil,) = open_source(Image.fromarray(array[:, :, ::-1]))  # PIL holds RGB
    np.testing.assert_array_equal(from_pil.image, array[:, :, ::-1])
    (grey,) = open_source(array[:, :, 0])
    assert grey.image.shape == (24, 32, 3)


def test_a_pil_image_is_read_as_its_file_is_upright_and_16_bit_scaled(tmp_path: Path) -> None:
    # A phone photo stored on its side with EXIF orientation 6 (turn 90 degrees clockwise to view): its path and its
    # Image.open give one upright frame; before, the PIL image stayed on its side (24 wide, 32 high swapped).
    image = Image.fromarray(bgr(3)[:, :, ::-1])
    exif = Image.Exif()
    exif[0x0112] = 6
    image.save(tmp_path / "side.png", exif=exif.tobytes())
    (from_path,) = open_source(tmp_path / "side.png")
    with Image.open(tmp_path / "side.png") as opened:
        (from_pil,) = open_source(opened)
    assert from_path.image.shape == (32, 24, 3)
    np.testing.assert_array_equal(from_pil.image, from_path.image)
    # 16-bit gray (a thermal or medical frame): scaled by 1/257 as its file is, not clipped to white by convert().
    (deep,) = open_source(Image.fromarray(np.full((4, 4), 257 * 100, np.uint16)))
    assert deep.image.shape == (4, 4, 3) and (deep.image == 100).all()


def test_a_list_mixes_arrays_pil_images_and_paths(tmp_path: Path) -> None:
    cv2.imwrite(str(tmp_path / "c.png"), bgr(2))
    frames = list(open_source([bgr(0), Image.fromarray(bgr(1)), tmp_path / "c.png"]))
    assert [f.name for f in frames] == ["image0.jpg", "image1.jpg", "c.png"]
    np.testing.assert_array_equal(frames[2].image, bgr(2)[:, :, ::-1])  # PNG is lossless


def test_arrays_that_are_not_images_are_named() -> None:
    with pytest.raises(ValueError, match=r"image0.jpg: expected a uint8 image array, got float32"):
        open_source(np.zeros((4, 4, 3), np.float32))
    with pytest.raises(ValueError, match=r"expected an image array .* got \[4, 4, 2\]"):
        open_source(np.zeros((4, 4, 2), np.uint8))


def test_folders_are_searched_recursively_and_globs_expand(tmp_path: Path) -> None:
    for name in ("b/x.jpg", "a/deep/y.png", "z.jpg"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(tmp_path / name), bgr(3))
    (tmp_path / "a" / "notes.txt").write_text("not an image")
    assert [f.name for f in open_source(tmp_path)] == ["a/deep/y.png", "b/x.jpg", "z.jpg"]
    assert [f.name for f in open_source(str(tmp_path / "*.jpg"))] == ["z.jpg"]
    assert [f.name for f in open_source(str(tmp_path / "**" / "*.jpg"))] == ["b/x.jpg", "z.jpg"]
    with pytest.raises(FileNotFoundError, match=r"\*.bmp: matches no image or video"):
        next(open_source(str(tmp_path / "*.bmp")))



def test_paths_with_brackets_lists_linked_folders_and_gifs(tmp_path: Path) -> None:
    """A file named like a glob (``photo[1].jpg``) is that file; a ``.txt`` lists sources, relative paths from the
    list's folder; a symlinked folder is searched (a link back up is not followed: no loop); an animated GIF is a
    video of its frames, as Ultralytics reads it."""
    cv2.imwrite(str(tmp_path / "photo[1].jpg"), bgr(4))
    assert [f.name for f in open_source(str(tmp_path / "photo[1].jpg"))] == ["photo[1].jpg"]  # was: matches none
    (tmp_path / "data" / "real").mkdir(parents=True)
    cv2.imwrite(str(tmp_path / "data" / "real" / "x.png"), bgr(5))
    (tmp_path / "top").mkdir()
    (tmp_path / "top" / "linked").symlink_to(tmp_path / "data" / "real")
    (tmp_path / "data" / "real" / "loop").symlink_to(tmp_path / "data")
    assert [f.name for f in open_source(tmp_path / "top")] == ["linked/x.png"]  # was: no images or videos
    assert [f.name for f in open_source(tmp_path / "data")] == ["real/x.png"]
    (tmp_path / "list.txt").write_text("photo[1].jpg\n\ndata/real/x.png\n")
    assert [f.name for f in open_source(str(tmp_path / "list.txt"))] == ["photo[1].jpg", "x.png"]
    frames = [Image.fromarray(np.full((20, 30, 3), 60 * index, np.uint8)) for index in range(3)]
    frames[0].save(tmp_path / "anim.gif", save_all=True, append_images=frames[1:], duration=200)
    read = list(open_source(tmp_path / "anim.gif"))
    assert [(f.name, f.index) for f in read] == [("anim.gif", 0), ("anim.gif", 1), ("anim.gif", 2)]
    assert [int(f.image.mean()) for f in read] == [0, 60, 120] and read[0].fps == pytest.approx(5.0)


def test_a_folders_images_decode_on_several_threads_and_come_out_in_path_order(tmp_path: Path, monkeypatch,
                                                                               capsys) -> None:
    """Twelve images, one undecodable and a video among them: decoded by three threads (each decode slowed by a
    varying sleep, so they finish out of order), yielded in path order, the bad one skipped with a line, the
    video's frames after the images sorted before it."""
    for index in range(12):
        cv2.imwrite(str(tmp_path / f"{index:02d}.png"), bgr(index))
    (tmp_path / "05.png").write_bytes(b"not a png")
    write_video(tmp_path / "06_clip.mp4", frames=2)
    threads = set()
    real_read = sources.read_image

    def slow_read(path: Path) -> np.ndarray:
        threads.add(threading.current_thread().name)
        time.sleep(0.002 * (11 - int(path.stem)))  # earlier paths take longer: a pool finishes them out of order
        return real_read(path)

    monkeypatch.setattr(sources, "read_image", slow_read)
    monkeypatch.setattr(sources, "DECODE_THREADS", 3)
    frames = list(open_source(tmp_path))
    names = [f"{index:02d}.png" for index in range(12) if index != 5]
    assert [(f.name, f.index) for f in frames] == [(n, None) for n in names[:6]] + [("06_clip.mp4", 0),
                                                   ("06_clip.mp4", 1)] + [(n, None) for n in names[6:]]
    still = [f for f in frames if f.index is None]
    assert all(np.array_equal(f.image, bgr(int(f.name[:2]))[..., ::-1]) for f in still)  # each its own pixels
    assert len(threads) > 1 and all(name.startswith("predict-decode") for name in threads)
    assert "05.png: cannot decode image" in capsys.readouterr().err

def test_sources_that_hold_nothing_are_named(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="empty: no images or videos"):
        next(open_source(tmp_path / "empty"))
    (tmp_path / "notes.md").write_text("not an image")
    with pytest.raises(FileNotFoundError, match=r"notes.md: not an image, a folder, a list \(.txt\) or a video"):
        next(open_source(tmp_path / "notes.md"))
    (tmp_path / "notes.txt").write_text("# a list of sources\nnot an image\n")
    with pytest.raises(FileNotFoundError, match="notes.txt, line 2: not an image: no such image, folder, video"):
        next(open_source(tmp_path / "notes.txt"))
    with pytest.raises(FileNotFoundError, match="missing.jpg: no such image, folder, video or glob"):
        next(open_source(tmp_path / "missing.jpg"))


@pytest.mark.parametrize("pattern", ["", "*.jpg"], ids=["folder", "glob"])
def test_a_source_whose_every_image_is_unreadable_is_an_error(tmp_path: Path, pattern: str, capsys) -> None:
    """Each bad image still gets its warning; then one line says nothing could be read (it was an empty run that
    reported success)."""
    (tmp_path / "a.jpg").write_bytes(b"not a jpeg")
    (tmp_path / "b.jpg").write_bytes(b"")
    source = f"{tmp_path}/{pattern}" if pattern else str(tmp_path)
    with pytest.raises(FileNotFoundError, match="^" + source.replace("*", "\\*") + ": no readable image or video "
                                                "frame in it \\(2 files, none readable\\)$"):
        list(open_source(source))
    warnings = capsys.readouterr().err
    assert "a.jpg: cannot decode image" in warnings and "b.jpg: " in warnings and warnings.count("skipped") == 2


def test_a_video_file_yields_numbered_rgb_frames(tmp_path: Path) -> None:
    write_video(tmp_path / "clip.mp4", frames=5)
    frames = list(open_source(tmp_path / "clip.mp4"))
    assert [f.index for f in frames] == [0, 1, 2, 3, 4] and {f.name for f in frames} == {"clip.mp4"}
    assert frames[0].fps == pytest.approx(7.0) and frames[3].image.shape == (48, 64, 3)
    assert abs(int(frames[3].image.mean()) - 120) <= 3  # mp4v is lossy; a flat grey survives within a few levels


@pytest.mark.parametrize("stride", [2, 3])
def test_vid_stride_takes_every_nth_frame_under_its_own_number(tmp_path: Path, stride: int) -> None:
    """``vid_stride=N``: frames 0, N, 2N, ... with their numbers in the video and the frame rate divided by N (a
    saved video lasts as long as its source); the same pixels as reading every frame gives them. In a list, each
    video keeps the stride."""
    write_video(tmp_path / "clip.mp4", frames=7)
    every = list(open_source(tmp_path / "clip.mp4"))
    frames = list(open_source(tmp_path / "clip.mp4", vid_stride=stride))
    assert [f.index for f in frames] == list(range(0, 7, stride))
    assert all(f.fps == pytest.approx(7.0 / stride) for f in frames)
    for frame in frames:
        np.testing.assert_array_equal(frame.image, every[frame.index].image)
    listed = list(open_source([tmp_path / "clip.mp4", bgr(0)], vid_stride=stride))
    assert [f.index for f in listed] == [*range(0, 7, stride), None]


class FakeCapture:
    """Stands for ``cv2.VideoCapture`` where no camera or network exists: records what it was opened with."""

    opened: list = []

    def __init__(self, target, frames: int = 3) -> None:
        FakeCapture.opened.append(target)
        self.left, self.released = frames, False

    def isOpened(self) -> bool:  # noqa: N802 - OpenCV's name
        return True

    def get(self, prop: int) -> float:
        return 25.0

    def read(self):
        if self.left == 0:
            return False, None
        self.left -= 1
        return True, np.zeros((8, 8, 3), np.uint8)

    def release(self) -> None:
        self.released = True


def test_a_webcam_index_opens_the_capture_with_an_int_and_a_url_with_its_text(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(sources.cv2, "VideoCapture", FakeCapture)
    FakeCapture.opened = []
    assert [f.name for f in open_source(0)] == ["webcam0"] * 3
    assert [f.index for f in open_source("1")] == [0, 1, 2]
    url = "rtsp://camera.local:554/stream"
    assert {f.name for f in open_source(url)} == {url}
    assert FakeCapture.opened == [0, 1, url] and type(FakeCapture.opened[1]) is int


def test_a_capture_that_does_not_open_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    class Closed(FakeCapture):
        def isOpened(self) -> bool:  # noqa: N802
            return False

    monkeypatch.setattr(sources.cv2, "VideoCapture", Closed)
    with pytest.raises(FileNotFoundError, match="^3: cannot open webcam$"):
        next(open_source(3))
    with pytest.raises(FileNotFoundError, match="^http://host/live: cannot open stream$"):
        next(open_source("http://host/live"))


def counting_frames(made: list[int], count: int = 100):
    for index in range(count):
        made.append(index)
        yield Frame("f", index, np.zeros((2, 2, 3), np.uint8))


def test_read_ahead_keeps_order_and_stays_bounded() -> None:
    made: list[int] = []
    ahead = read_ahead(counting_frames(made), depth=3)
    assert next(ahead).index == 0
    time.sleep(0.3)  # let the reader fill its queue
    # one taken + 3 queued + 1 held by the reader waiting for room: never the whole source
    assert len(made) <= 5
    assert [frame.index for frame in ahead] == list(range(1, 100))


def test_read_ahead_raises_the_readers_error_and_stops_when_closed() -> None:
    def broken():
        yield Frame("a", 0, np.zeros((2, 2, 3), np.uint8))
        raise FileNotFoundError("b.jpg: cannot read")

    frames = read_ahead(broken())
    assert next(frames).name == "a"
    with pytest.raises(FileNotFoundError, match="b.jpg: cannot read"):
        next(frames)
    made: list[int] = []
    ahead = read_ahead(counting_frames(made, count=10_000), depth=2)
    next(ahead)
    ahead.close()  # a consumer's break
    assert not any(thread.name == "predict-reader" for thread in threading.enumerate())
    assert len(made) < 10


def test_closing_early_releases_the_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    captures: list[FakeCapture] = []

    def make(target):
        captures.append(FakeCapture(target, frames=1000))
        return captures[-1]

    monkeypatch.setattr(sources.cv2, "VideoCapture", make)
    stream = read_ahead(open_source(0), depth=2)
    next(stream)
    stream.close()
    assert captures[0].released


def test_a_file_that_is_no_video_is_one_line_without_ffmpegs(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    """OpenCV's FFmpeg wrote its own line (``[mov,mp4,...] moov atom not found``) to the process's stderr before
    ours; the file is named as a video, not a stream."""
    fake = tmp_path / "fake.mp4"
    fake.write_bytes(b"not a video")
    with pytest.raises(FileNotFoundError, match=r"fake.mp4: cannot open video$"):
        next(open_source(str(fake)))
    assert capfd.readouterr().err == ""


def test_a_video_that_will_not_open_among_other_files_is_skipped_with_a_line(tmp_path: Path, capsys) -> None:
    """As an undecodable image of a folder is: a warning, and the other files' frames (it stopped the whole run);
    alone it is still the run's error."""
    (tmp_path / "broken.mp4").write_bytes(b"not a video")
    cv2.imwrite(str(tmp_path / "z.png"), bgr(6))
    assert [f.name for f in open_source(tmp_path)] == ["z.png"]
    assert capsys.readouterr().err == f"warning: {tmp_path / 'broken.mp4'}: cannot open video; skipped\n"
    with pytest.raises(FileNotFoundError, match="broken.mp4: cannot open video$"):
        next(open_source(tmp_path / "broken.mp4"))


def test_an_image_url_is_downloaded_and_decoded_as_its_file_is(tmp_path: Path) -> None:
    """``https://ultralytics.com/images/bus.jpg`` as Ultralytics reads it: one still image named by the URL's file
    name (OpenCV's capture read it as a one-frame video); a missing one or one that is no image is one line. Served
    here from this machine."""
    import functools
    import http.server

    cv2.imwrite(str(tmp_path / "bus.png"), bgr(7))
    (tmp_path / "fake.jpg").write_text("not an image")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *args: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        (frame,) = open_source(f"{base}/bus.png")
        assert frame.name == "bus.png" and frame.index is None
        np.testing.assert_array_equal(frame.image, bgr(7)[:, :, ::-1])  # PNG: the same pixels as from the file
        with pytest.raises(FileNotFoundError, match=r"missing.jpg: cannot download \(HTTP 404 "):
            next(open_source(f"{base}/missing.jpg"))
        with pytest.raises(ValueError, match=r"fake.jpg: cannot decode image \(cannot identify image file"):
            next(open_source(f"{base}/fake.jpg"))
    finally:
        server.shutdown()


def test_a_tensor_is_one_frame_per_image_as_ultralytics_takes_it() -> None:
    """``[B, 3, H, W]`` / ``[3, H, W]`` RGB floats in [0, 1] -> RGB uint8 frames; a wrong shape, range or type is one
    line (a tensor was read as a file name, its whole text in the error)."""
    import torch

    rgb = np.random.default_rng(0).integers(0, 256, (2, 24, 32, 3), dtype=np.uint8)
    tensor = torch.from_numpy(rgb).permute(0, 3, 1, 2).float() / 255
    frames = list(open_source(tensor))
    assert [f.name for f in frames] == ["image0.jpg", "image1.jpg"]
    np.testing.assert_array_equal(np.stack([f.image for f in frames]), rgb)
    assert [f.name for f in open_source([tensor[0], rgb[1]])] == ["image0.jpg", "image1.jpg"]
    for bad, problem in ((tensor * 255, "must be in \\[0, 1\\]"), (tensor[:, 0], "expected a float tensor"),
                         (True, "got bool"), ({"a": 1}, "got dict")):
        with pytest.raises((ValueError, TypeError), match=problem):
            list(open_source(bad))
