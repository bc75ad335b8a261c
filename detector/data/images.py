"""Image files: a header-level check for the whole dataset at start-up, and the decode used for training.

The check reads what the file's header says (format, size, EXIF orientation) and whether the file is
complete, without decoding the pixels: a JPEG must end with its end-of-image marker and a PNG's chunks must
pass their CRCs (Pillow's ``verify``). A full decode was 20x slower (about 1 ms against 0.05 ms for a
640x480 JPEG), two minutes for COCO on one core. Only files whose end cannot be checked cheaply (a JPEG with
bytes after its end marker, other formats) are decoded in full, and PNGs with chunks after their pixels, which
may turn them (Pillow reads those as it decodes). An image that passes and still fails to
decode during training is replaced for that step (:class:`detector.data.dataset.DetectionDataset`)."""

from __future__ import annotations

import os
from pathlib import Path

import cv2
import numpy as np
from PIL import Image, ImageOps

JPEG_END = b"\xff\xd9"
EXIF_ORIENTATION = 0x0112
AXES_SWAPPING_ORIENTATIONS = (5, 6, 7, 8)  # EXIF orientations shown rotated by 90 degrees
READ_ERRORS = (OSError, SyntaxError, ValueError, Image.DecompressionBombError)


def _jpeg_is_complete(path: Path) -> bool:
    with open(path, "rb") as file:
        file.seek(-2, os.SEEK_END)
        return file.read(2) == JPEG_END


def _png_has_chunks_after_pixels(path: Path) -> bool:
    """Whether a chunk other than more pixel data follows a PNG's first IDAT, found by reading the chunk headers.

    Pillow reads the chunks after the pixels (an eXIf, an XMP or text EXIF profile, all allowed there) only when
    it decodes them; the decoder (:func:`decode_with_pillow`) turns the image by what they say, so the check must
    read them too. A damaged chunk list answers True: the decode that follows says what is wrong.
    """
    with open(path, "rb") as file:
        file.seek(8)  # the PNG signature
        seen_pixels = False
        while len(header := file.read(8)) == 8:
            length, kind = int.from_bytes(header[:4], "big"), header[4:]
            if kind == b"IEND":
                return False
            if kind == b"IDAT":
                seen_pixels = True
            elif seen_pixels:
                return True
            file.seek(length + 4, os.SEEK_CUR)  # the data and its CRC
    return True


def _exif_orientation_read(image: Image.Image) -> int:
    """The EXIF orientation tag from the chunks Pillow has read (eXIf, a text EXIF profile, XMP), as the decoder
    reads it; the base class's ``getexif``, as a PNG's own decodes the pixels unless an eXIf chunk precedes them."""
    return Image.Image.getexif(image).get(EXIF_ORIENTATION, 1)


def check_image(path: Path) -> tuple[tuple[int, int] | None, str]:
    """``((height, width) upright, "")`` for a usable image, else ``(None, reason)``."""
    try:
        if os.stat(path).st_size == 0:
            return None, "zero-byte file"
        with Image.open(path) as image:
            width, height = image.size
            if image.format == "PNG":
                decode = _png_has_chunks_after_pixels(path)
                if decode:
                    image.load()  # Pillow reads the chunks after the pixels only as it decodes them
                orientation = _exif_orientation_read(image)
                if not decode:
                    image.verify()  # walks every chunk and checks its CRC; no decompression
            else:
                orientation = image.getexif().get(EXIF_ORIENTATION, 1)
                if image.format != "JPEG" or not _jpeg_is_complete(path):
                    image.load()  # no cheap completeness test: decode it once
            if orientation in AXES_SWAPPING_ORIENTATIONS:
                width, height = height, width
    except FileNotFoundError:
        return None, "file not found"
    except IsADirectoryError:
        # A .txt list's line naming a folder (images/odd.jpg/): the OS's "[Errno 21] Is a directory:" said it
        # less plainly. A split's folder walk reads such a folder as any subfolder and never lists it here.
        return None, "a folder, not an image file"
    except READ_ERRORS as error:
        return None, error_reason(error, path)
    if width < 1 or height < 1:
        return None, f"empty image ({width}x{height})"
    return (height, width), ""


def error_reason(error: BaseException, path: Path) -> str:
    """A read error's message without the path it often repeats (Pillow's "cannot identify image file '/x/a.jpg'"):
    the line that reports it names the file already."""
    text = str(error).replace(f" {str(path)!r}", "").replace(f" {str(path)}", "").strip()
    return text or type(error).__name__


SIXTEEN_BIT_MODES = ("I;16", "I;16B", "I;16L", "I;16N")


class ImageError(ValueError):
    """An image file that cannot be decoded; the message names the file and why (one line)."""


def to_rgb8(image: Image.Image) -> np.ndarray:
    """Any Pillow mode -> ``uint8 [H, W, 3]`` RGB, the way the image looks on screen.

    - 16-bit gray (``I;16``): ``value / 257``, so the full 16-bit range maps onto the full 8-bit range and
      a 16-bit copy of an 8-bit image decodes to the same pixels (a stretch to each image's own maximum
      would make one scene brighter or darker depending on its brightest pixel). Pillow opens 16-bit
      RGB(A) PNGs as 8-bit RGB(A) already (the high byte).
    - 32-bit integer gray (``I``): as 16-bit when any value exceeds 255 (Pillow's mode for some 16-bit
      files), else as the 8-bit values it holds; clipped to the range.
    - Gray, palette, bilevel, CMYK (Adobe's inverted CMYK JPEGs are handled by the decoder), YCbCr and
      float images: Pillow's own conversion to RGB (floats clipped to 0..255).
    - An alpha channel is dropped (the colour under it is kept), as OpenCV's ``imread`` does, so training
      and ``predict`` see what Ultralytics would.
    """
    if image.mode in SIXTEEN_BIT_MODES or image.mode == "I":
        array = np.asarray(image).astype(np.float32)
        if image.mode in SIXTEEN_BIT_MODES or float(array.max(initial=0)) > 255:
            array = array / 257
        gray = np.rint(array.clip(0, 255)).astype(np.uint8)
        return np.ascontiguousarray(np.repeat(gray[..., None], 3, 2))
    if image.mode != "RGB":
        image = image.convert("RGB")
    return np.ascontiguousarray(np.asarray(image))


def read_image_rgb(path: Path) -> np.ndarray:
    """Decode to ``uint8 [H, W, 3]`` RGB, honouring EXIF rotation (any mode: :func:`to_rgb8`).

    Pillow reads the header (format, mode, orientation; its size check against decompression bombs). An upright
    colour or gray JPEG, what nearly every detection dataset holds, is then decoded by OpenCV: the same
    libjpeg-turbo in both wheels gives the same pixels (BCCD, coco128 and the shapes set: identical, checked by
    tests/data/test_images.py), and OpenCV's buffer is the result (its channels swapped in place) where Pillow's
    NumPy view copies the pixels through ``tobytes``. Everything else goes through Pillow, turned upright and
    converted only when it has to be (its ``exif_transpose`` and ``convert`` each copy the pixels even when there
    is nothing to do), and so does a JPEG OpenCV refuses (its own pixel limit). One thread, a 640x480 BCCD JPEG:
    1.3 ms against 7.3 ms before (``benchmarks/decode_speed.py``). The price: a JPEG with damaged but decodable
    data makes libjpeg print its warning to stderr (Pillow kept it quiet), as in Ultralytics.
    """
    with Image.open(path) as image:
        if image.format == "JPEG" and image.mode in ("RGB", "L") and image.getexif().get(EXIF_ORIENTATION, 1) == 1:
            # IGNORE_ORIENTATION: Pillow has read it (from XMP too, which OpenCV does not) and found it upright.
            try:
                bgr = cv2.imdecode(np.fromfile(path, np.uint8), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
            except cv2.error:  # beyond OpenCV's own pixel limit (Pillow's may have been lifted): Pillow's turn
                bgr = None
            if bgr is not None:  # else Pillow decodes it, and says what is wrong
                return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB, dst=bgr)  # in place: no second buffer
        return decode_with_pillow(image)


def decode_with_pillow(image: Image.Image) -> np.ndarray:
    """An opened image decoded by Pillow, upright (:func:`to_rgb8`): turned and converted only when it has to be."""
    image.load()  # a PNG's EXIF chunk may follow its pixels: the orientation is known once they are read
    if image.getexif().get(EXIF_ORIENTATION, 1) != 1:
        return to_rgb8(ImageOps.exif_transpose(image))
    return to_rgb8(image)


def read_image(path: Path) -> np.ndarray:
    """:func:`read_image_rgb` for a file a user named: an undecodable one raises :class:`ImageError`."""
    try:
        return read_image_rgb(path)
    except READ_ERRORS as error:
        reason = "zero-byte file" if path.is_file() and path.stat().st_size == 0 else error_reason(error, path)[:200]
        raise ImageError(f"{path}: cannot decode image ({reason})") from None
