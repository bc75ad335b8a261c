"""What predict runs on: every kind of source as one stream of RGB frames, decoded ahead of the model.

:func:`open_source` takes what a user hands over, as Ultralytics takes it:

- a NumPy array ``uint8 [H, W, 3]`` in **BGR** order (OpenCV's ``cv2.imread``, Ultralytics' convention), or
  ``[H, W]`` grey, or ``[H, W, 4]`` BGRA;
- a PIL image (any mode; converted to RGB);
- a PyTorch tensor ``[3, H, W]`` or ``[B, 3, H, W]``, RGB floats in ``[0, 1]`` (Ultralytics' tensor source): one
  frame per image;
- a list or tuple of any of these, or of paths;
- a path: an image, a video file (an animated GIF too), or a folder (searched recursively, through symlinked
  folders, images and videos, sorted);
- a ``.txt`` file listing sources, one per line (paths relative to the working folder, else to the list's);
- a glob: ``"imgs/*.jpg"``, ``"data/**/*.png"`` (``**`` recurses); an existing path is never read as a glob
  (``photos[1].jpg``);
- a webcam index: ``0`` or ``"0"``;
- an image URL (``https://.../bus.jpg``): downloaded into memory and decoded as a file is;
- a network stream or remote video: ``rtsp://``, ``rtmp://``, ``http(s)://`` URLs, read by OpenCV (FFmpeg).

Each yields :class:`Frame` objects; :func:`read_ahead` runs that iterator in a thread with a small bounded
queue, so JPEG and video decoding overlap the model and a long video never piles up in memory.
"""

from __future__ import annotations

import glob
import io
import os
import queue
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Generator, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from PIL import Image

from detector.data.images import READ_ERRORS, ImageError, decode_with_pillow, read_image
from detector.data.spec import IMAGE_SUFFIXES
from detector.data.workers import usable_cores
from detector.files import folder_files

# .gif is read as a video (each of its frames), as Ultralytics reads it: OpenCV's capture decodes it.
VIDEO_SUFFIXES = frozenset({".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v", ".mpg", ".mpeg", ".wmv", ".ts", ".gif",
                            ".asf"})
STREAM_PREFIXES = ("rtsp://", "rtmp://", "http://", "https://", "tcp://", "udp://")
URL_IMAGE_LIMIT = 100 << 20  # bytes an image URL may send: more is no photo (and would sit in memory whole)
URL_TIMEOUT = 30.0  # seconds without a byte before an image download is given up
READ_AHEAD = 4  # frames decoded ahead of the model: enough to hide a decode behind a forward, little memory
# Threads decoding a folder's or glob's still images (Pillow decodes with the GIL released). One thread decodes
# 180-250 640x480 JPEGs a second (4-5.5 ms each on a 2-core EPYC), far less than a GPU runs at --batch 32.
# Videos decode in order, on one.
DECODE_THREADS = max(1, min(8, usable_cores()))


class VideoUnreadable(FileNotFoundError):
    """A video, webcam or stream that OpenCV cannot open; the message names it."""


@dataclass(frozen=True)
class Frame:
    """One image for the model.

    Attributes:
        name: where it came from, for results and saved files: a path relative to the folder or glob it was
            found in (``"a/x.jpg"``), a file name, ``"image0.jpg"`` for the n-th in-memory image, ``"webcam0"``
            or the URL for a stream.
        index: the frame number in a video or stream; ``None`` for a still image.
        image: RGB ``uint8 [H, W, 3]``, contiguous.
        fps: frames per second of a video or stream (0 for still images): the rate of a saved video.
    """

    name: str
    index: int | None
    image: np.ndarray
    fps: float = 0.0


def open_source(source: Any, *, vid_stride: int = 1) -> Iterator[Frame]:
    """Every frame of ``source`` (see the module docstring), lazily: nothing is decoded before it is asked for; of a
    video or stream every ``vid_stride``-th (:func:`capture_frames`).

    Raises (on the first ``next``):
        FileNotFoundError: a path, folder or glob with nothing to read, or a video or stream that cannot be opened.
        ValueError: an array or object that is not an image, naming it.
    """
    if isinstance(source, (list, tuple)):
        return _many(source, vid_stride)
    if is_tensor(source):
        return tensor_frames(source, 0)
    if is_in_memory(source):
        return iter([in_memory_frame(source, 0)])
    if isinstance(source, bool) or not isinstance(source, (str, os.PathLike, int)):
        raise TypeError(f"source: expected a path, folder, glob, URL, webcam index, image array, PIL image, tensor "
                        f"or a list of them, got {type(source).__name__}")
    if isinstance(source, str) and is_image_url(source):
        return url_image_frames(source)
    if (capture := capture_source(source)) is not None:
        return capture_frames(*capture, vid_stride=vid_stride)
    return files_frames(str(source), vid_stride=vid_stride)


def is_image_url(text: str) -> bool:
    """An http(s) URL whose path ends in an image suffix (``https://ultralytics.com/images/bus.jpg``)."""
    parts = urllib.parse.urlsplit(text)
    return parts.scheme.lower() in ("http", "https") and Path(parts.path).suffix.lower() in IMAGE_SUFFIXES


def url_image_frames(url: str) -> Iterator[Frame]:
    """The image at ``url``, downloaded into memory (at most :data:`URL_IMAGE_LIMIT` bytes) and decoded as a file
    would be, named by the URL's file name, as Ultralytics reads an image URL (OpenCV's capture read it as a
    one-frame video). One line on a failed download or decode."""
    try:
        with urllib.request.urlopen(url, timeout=URL_TIMEOUT) as response:
            data = response.read(URL_IMAGE_LIMIT + 1)
    except urllib.error.HTTPError as error:
        raise FileNotFoundError(f"{url}: cannot download (HTTP {error.code} {error.reason})") from None
    except (urllib.error.URLError, OSError, ValueError) as error:
        raise FileNotFoundError(f"{url}: cannot download ({getattr(error, 'reason', None) or error})") from None
    if len(data) > URL_IMAGE_LIMIT:
        raise FileNotFoundError(f"{url}: more than {URL_IMAGE_LIMIT >> 20} MB, not read as an image")
    try:
        with Image.open(io.BytesIO(data)) as image:
            pixels = decode_with_pillow(image)
    except READ_ERRORS as error:
        raise ImageError(f"{url}: cannot decode image ({str(error)[:200]})") from None
    yield Frame(Path(urllib.parse.urlsplit(url).path).name, None, pixels)


def capture_source(source: Any) -> tuple[int | str, str] | None:
    """``(what OpenCV's capture opens, the frames' name)`` for a webcam index (``0``, ``"0"`` where no such file
    exists) or a stream URL; None for every other source."""
    if isinstance(source, (bool, list, tuple)) or is_in_memory(source) or is_tensor(source):
        return None
    if isinstance(source, int):
        return source, f"webcam{source}"
    text = str(source)
    if text.isdigit() and not Path(text).exists():
        return int(text), f"webcam{text}"
    return (text, text) if text.lower().startswith(STREAM_PREFIXES) else None


def is_live(source: Any) -> bool:
    """A webcam or a network stream: frames that arrive in real time, whose results should not wait for later
    frames."""
    return capture_source(source) is not None


def is_in_memory(item: Any) -> bool:
    return isinstance(item, np.ndarray) or type(item).__module__.startswith("PIL.")


def is_tensor(item: Any) -> bool:
    return type(item).__module__.startswith("torch") and type(item).__name__ in ("Tensor", "Parameter")


def tensor_frames(tensor: Any, position: int) -> Iterator[Frame]:
    """``[3, H, W]`` or ``[B, 3, H, W]`` RGB floats in [0, 1] (as Ultralytics takes a tensor) -> one frame per image,
    named ``image<N>.jpg`` from ``position`` on; ``ValueError`` naming the shape or range otherwise."""
    images = tensor.detach()
    if images.dim() == 3:
        images = images.unsqueeze(0)
    if images.dim() != 4 or images.shape[1] != 3 or not images.is_floating_point():
        raise ValueError(f"source: expected a float tensor [3, H, W] or [B, 3, H, W] (RGB in [0, 1]), got "
                         f"{images.dtype} {list(tensor.shape)}")
    if images.numel() and (images.min() < 0 or images.max() > 1):
        raise ValueError(f"source: a tensor's values must be in [0, 1] (RGB scaled by 1/255), got "
                         f"{float(images.min()):.3g} to {float(images.max()):.3g}")
    import torch  # the caller's tensor: torch is loaded already

    pixels = (images.float() * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    for offset, image in enumerate(pixels):
        yield Frame(f"image{position + offset}.jpg", None, np.ascontiguousarray(image))


def _many(items: list | tuple, vid_stride: int) -> Iterator[Frame]:
    for position, item in enumerate(items):
        if is_tensor(item):
            yield from tensor_frames(item, position)
        elif is_in_memory(item):
            yield in_memory_frame(item, position)
        else:
            yield from open_source(item, vid_stride=vid_stride)


def in_memory_frame(item: Any, position: int) -> Frame:
    """A NumPy array (BGR, as OpenCV and Ultralytics give it) or a PIL image -> a :class:`Frame`.

    A PIL image is read as its file would be (:func:`decode_with_pillow`): turned upright by its EXIF orientation (a
    phone's ``Image.open`` photo gets the boxes its path gets; Ultralytics leaves it on its side) and 16-bit gray
    scaled to 8 bits (Pillow's own ``convert("RGB")`` clips it, a white image)."""
    name = f"image{position}.jpg"
    if isinstance(item, np.ndarray):
        return Frame(name, None, bgr_array_to_rgb(item, name))
    return Frame(Path(getattr(item, "filename", "") or name).name, None, decode_with_pillow(item))


def bgr_array_to_rgb(array: np.ndarray, name: str) -> np.ndarray:
    """``uint8 [H, W]`` grey, ``[H, W, 3]`` BGR or ``[H, W, 4]`` BGRA -> RGB ``[H, W, 3]``; ``ValueError`` otherwise."""
    if array.dtype != np.uint8:
        raise ValueError(f"{name}: expected a uint8 image array, got {array.dtype} (scale floats to 0-255 first)")
    if array.ndim == 2:
        return cv2.cvtColor(array, cv2.COLOR_GRAY2RGB)
    if array.ndim == 3 and array.shape[2] == 3:
        return np.ascontiguousarray(array[:, :, ::-1])
    if array.ndim == 3 and array.shape[2] == 4:
        return cv2.cvtColor(array, cv2.COLOR_BGRA2RGB)
    raise ValueError(f"{name}: expected an image array [H, W], [H, W, 3] (BGR) or [H, W, 4], got {list(array.shape)}")


def files_frames(text: str, *, vid_stride: int = 1) -> Iterator[Frame]:
    """A file, a folder (recursive) or a glob -> its images' and videos' frames, in sorted path order.

    ``FileNotFoundError`` when not one frame of them could be read (each unreadable image was skipped with a line):
    a run over nothing is a mistake to say, not a success to report."""
    path = Path(text)
    if path.suffix.lower() == ".txt" and path.is_file():
        yield from listed_frames(path, vid_stride=vid_stride)
        return
    if not path.exists() and any(char in text for char in "*?["):
        found = [Path(match) for match in glob.glob(text, recursive=True)]
        files, root = [p for p in found if readable(p)], Path(glob_root(text))
        if not files:
            raise FileNotFoundError(f"{text}: matches no image or video")
    elif path.is_dir():
        files, root = [file for file in folder_files(path) if readable(file)], path
        if not files:
            raise FileNotFoundError(f"{path}: no images or videos (searched recursively)")
    elif path.is_file() and readable(path):
        files, root = [path], path.parent
    elif path.exists():
        raise FileNotFoundError(f"{path}: not an image, a folder, a list (.txt) or a video "
                                f"({', '.join(sorted(VIDEO_SUFFIXES))})")
    else:
        raise FileNotFoundError(f"{path}: no such image, folder, video or glob")
    decoding: deque[tuple[str, Future]] = deque()  # still images in flight, in path order
    pool = ThreadPoolExecutor(DECODE_THREADS, thread_name_prefix="predict-decode")
    read = 0  # frames given
    try:
        for file in sorted(files):
            name = file.relative_to(root).as_posix() if file.is_relative_to(root) else file.name
            if file.suffix.lower() in VIDEO_SUFFIXES:
                while decoding:  # the images before it first, in order
                    read += yield from _decoded(*decoding.popleft(), only=len(files) == 1)
                try:
                    read += yield from capture_frames(str(file), name, vid_stride=vid_stride)
                except VideoUnreadable as error:  # one bad video of many is skipped, as a bad image is
                    if len(files) == 1:
                        raise
                    print(f"warning: {error}; skipped", file=sys.stderr)
                continue
            decoding.append((name, pool.submit(read_image, file)))
            if len(decoding) > 2 * DECODE_THREADS:  # enough to keep every thread busy, no more in memory
                read += yield from _decoded(*decoding.popleft(), only=len(files) == 1)
        while decoding:
            read += yield from _decoded(*decoding.popleft(), only=len(files) == 1)
        if not read:
            raise FileNotFoundError(f"{text}: no readable image or video frame in it ({len(files)} "
                                    f"file{'s' if len(files) != 1 else ''}, none readable)")
    finally:
        # Closed early (a break, Ctrl-C, an error): the queued decodes are dropped, not run; at most the ones
        # already running finish, on their own threads.
        pool.shutdown(wait=False, cancel_futures=True)


def listed_frames(listing: Path, *, vid_stride: int) -> Iterator[Frame]:
    """The frames of the sources a ``.txt`` file lists, one per line (blank lines and ``#`` comments skipped): a
    relative path from the working folder where it exists there, else from the list's folder, as Ultralytics
    reads such a list."""
    lines = [line.strip() for line in listing.read_text(encoding="utf-8").splitlines()]
    sources = [(number, line) for number, line in enumerate(lines, 1) if line and not line.startswith("#")]
    if not sources:
        raise FileNotFoundError(f"{listing}: lists no source (one image, folder, video, glob or URL per line)")
    for number, source in sources:
        beside = listing.parent / source
        local = not Path(source).exists() and beside.exists() and "://" not in source
        try:
            yield from open_source(str(beside) if local else source, vid_stride=vid_stride)
        except FileNotFoundError as error:
            raise FileNotFoundError(f"{listing}, line {number}: {error}") from None


def _decoded(name: str, decoding: Future, *, only: bool) -> Generator[Frame, None, int]:
    """The frame of one decoded still image; one bad image of many is skipped with a line, the only one given
    fails the command. Returns the frames given: 1, or 0 for a skipped image."""
    try:
        image = decoding.result()
    except ImageError as error:
        if only:
            raise
        print(f"warning: {error}; skipped", file=sys.stderr)
        return 0
    yield Frame(name, None, image)
    return 1


def readable(path: Path) -> bool:
    return path.suffix.lower() in IMAGE_SUFFIXES or path.suffix.lower() in VIDEO_SUFFIXES


def glob_root(pattern: str) -> str:
    """The folder part of a glob before its first wildcard: ``imgs/a/*.jpg`` -> ``imgs/a``."""
    parts = Path(pattern).parts
    fixed = list(iter_until_wildcard(parts))
    return str(Path(*fixed)) if fixed else "."


def iter_until_wildcard(parts: tuple[str, ...]) -> Iterator[str]:
    for part in parts[:-1]:
        if any(char in part for char in "*?["):
            return
        yield part


def capture_frames(target: int | str, name: str, *, vid_stride: int = 1) -> Generator[Frame, None, int]:
    """Frames of ``cv2.VideoCapture(target)``: an int opens a webcam, text a video file or a stream URL. Returns how
    many it gave.

    ``vid_stride``: every N-th frame from the first, each keeping its own number in the source (``index``: 0, N,
    2N, ...; Ultralytics numbers the frames it keeps 1, 2, 3); the others are only grabbed, not decoded, and the
    frame rate is divided by N, so a saved video lasts as long as its source."""
    capture = quiet_capture(target)
    try:
        if not capture.isOpened():
            what = "webcam" if isinstance(target, int) else "video" if Path(target).is_file() else "stream"
            raise VideoUnreadable(f"{target}: cannot open {what}")
        fps = (capture.get(cv2.CAP_PROP_FPS) or 30.0) / vid_stride
        index = given = 0
        while True:
            ok, bgr = capture.read()
            if not ok:
                return given
            yield Frame(name, index, cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), fps)
            given += 1
            for _ in range(vid_stride - 1):  # grabbed, not decoded: the skipped frames cost a demux, not a decode
                index += 1
                if not capture.grab():
                    return given
            index += 1
    finally:
        capture.release()


# FFmpeg's own lines (``[mov,mp4,...] moov atom not found`` before our one line for a file that is no video): fatal
# errors only (AV_LOG_FATAL), unless the user set a level. OpenCV reads this once, when its FFmpeg backend first
# opens or writes a file anywhere in the process, so it is set when this module is imported, before any capture.
os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "8")


_LOG_LEVEL_LOCK = threading.Lock()


def quiet_capture(target: int | str) -> cv2.VideoCapture:
    """``cv2.VideoCapture(target)`` without OpenCV's own lines on stderr (``[ERROR:0@0.079] global
    obsensor_uvc_stream_channel.cpp:163 ... Camera index out of range``): a source that does not open is the
    caller's one line."""
    logging = getattr(getattr(cv2, "utils", None), "logging", None)  # OpenCV's own logger (4.5 and later)
    if logging is None:
        return cv2.VideoCapture(target)
    with _LOG_LEVEL_LOCK:  # the level is the process's: two opening at once must not leave it silent for good
        level = logging.getLogLevel()
        logging.setLogLevel(logging.LOG_LEVEL_SILENT)
        try:
            return cv2.VideoCapture(target)
        finally:
            logging.setLogLevel(level)


_DONE = object()


def read_ahead(frames: Iterable[Frame], depth: int = READ_AHEAD) -> Iterator[Frame]:
    """``frames``, decoded in a background thread at most ``depth`` ahead of the consumer.

    OpenCV and PIL decode with the GIL released, so decoding overlaps the model. The queue bounds memory
    (``depth`` frames, ~25 MB at 1080p for 4). An error in the reader is raised here, at the frame it hit.
    Closing the generator early (``break``) stops the reader and releases its capture.
    """
    buffer: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                buffer.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def reader() -> None:
        iterator = iter(frames)
        try:
            for frame in iterator:
                if not put(frame):
                    break
            else:
                put(_DONE)
        except BaseException as error:  # noqa: BLE001 - handed to the consumer, raised there
            put(error)
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                close()  # a generator's finally (the capture's release) runs in this thread

    thread = threading.Thread(target=reader, name="predict-reader", daemon=True)
    thread.start()
    try:
        while True:
            item = buffer.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join(timeout=5)
