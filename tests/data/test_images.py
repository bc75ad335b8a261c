"""Images in every common mode decode like their RGB twin and train (detector/data/images.py)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import warnings
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from detector.data.build import load_records
from detector.data.images import ImageError, check_image, read_image, read_image_rgb
from detector.data.spec import load_dataset_spec
from detector.training.config import TrainConfig
from detector.training.trainer import train
from tests.conftest import write_yolo_dataset

# Stripes and a gradient, so a channel swap, an inversion or a wrong scale shows in any mode.
BASE = np.zeros((48, 64, 3), np.uint8)
BASE[..., 0] = np.arange(64, dtype=np.uint8)[None, :] * 4
BASE[..., 1] = np.arange(48, dtype=np.uint8)[:, None] * 5
BASE[::4, :, 2] = 255
GRAY = BASE[..., 0]
# Pillow writes CMYK JPEGs without chroma subsampling, so at quality 95 this pattern comes back exact (measured:
# 0 levels; the RGB JPEG of it, subsampled, is off by up to 145 at the stripes). 4 levels allow for another
# libjpeg's rounding; an inverted channel moves the pixels by ~168 levels on average, swapped channels by ~85.
JPEG_LEVELS = 4


def _write(folder: Path, mode: str) -> tuple[Path, np.ndarray, int]:
    """One image of ``mode``; its expected RGB decode and how many levels a pixel may differ by."""
    rgb = Image.fromarray(BASE)
    gray3 = np.repeat(GRAY[..., None], 3, 2)
    if mode == "gray":
        path = folder / "gray.png"
        cv2.imwrite(str(path), GRAY)
        return path, gray3, 0
    if mode == "gray16":  # the 8-bit image x 257: the full 16-bit range
        path = folder / "gray16.png"
        cv2.imwrite(str(path), GRAY.astype(np.uint16) * 257)
        return path, gray3, 0
    if mode == "rgb16":
        path = folder / "rgb16.png"
        cv2.imwrite(str(path), BASE[..., ::-1].astype(np.uint16) * 257)
        return path, BASE, 0
    if mode == "rgba":  # alpha is dropped; the colour under it stays
        path = folder / "rgba.png"
        Image.fromarray(np.dstack([BASE, np.full(GRAY.shape, 7, np.uint8)])).save(path)
        return path, BASE, 0
    if mode == "gray_alpha":
        path = folder / "la.png"
        Image.fromarray(np.dstack([GRAY, GRAY])).save(path)
        return path, gray3, 0
    if mode == "palette":
        path = folder / "p.png"
        image = rgb.quantize(256)
        image.save(path)
        return path, np.asarray(image.convert("RGB")), 0
    if mode == "cmyk_jpeg":
        path = folder / "cmyk.jpg"
        rgb.convert("CMYK").save(path, quality=95)
        return path, BASE, JPEG_LEVELS
    if mode == "int32_tiff":  # Pillow's "I": 8-bit values kept as they are
        path = folder / "i.tif"
        Image.fromarray(GRAY.astype(np.int32)).save(path)
        return path, gray3, 0
    if mode == "bilevel":
        path = folder / "b.png"
        Image.fromarray(GRAY > 127).save(path)
        return path, np.where(gray3 > 127, 255, 0).astype(np.uint8), 0
    raise ValueError(mode)


MODES = ["gray", "gray16", "rgb16", "rgba", "gray_alpha", "palette", "cmyk_jpeg", "int32_tiff", "bilevel"]


@pytest.mark.parametrize("mode", MODES)
def test_each_mode_decodes_to_its_rgb_twin(tmp_path: Path, mode: str):
    path, expected, levels = _write(tmp_path, mode)
    assert check_image(path) == ((48, 64), "")
    image = read_image_rgb(path)
    assert image.dtype == np.uint8 and image.shape == (48, 64, 3) and image.flags.c_contiguous
    difference = np.abs(image.astype(np.int16) - expected).max()
    assert difference <= levels, (mode, difference)


# EXIF orientation -> how the stored pixels turn upright (the EXIF specification's eight cases), in NumPy
# rather than Pillow: read_image_rgb skips Pillow's exif_transpose when there is nothing to turn.
UPRIGHT = {
    1: lambda a: a,
    2: lambda a: a[:, ::-1],
    3: lambda a: a[::-1, ::-1],
    4: lambda a: a[::-1],
    5: lambda a: a.transpose(1, 0, 2),
    6: lambda a: np.rot90(a, -1),
    7: lambda a: a[::-1, ::-1].transpose(1, 0, 2),
    8: lambda a: np.rot90(a, 1),
}


@pytest.mark.parametrize("orientation", sorted(UPRIGHT))
@pytest.mark.parametrize("suffix", [".png", ".jpg"])
def test_every_exif_orientation_decodes_upright(tmp_path: Path, orientation: int, suffix: str):
    exif = Image.Exif()
    exif[0x0112] = orientation
    path = tmp_path / f"o{orientation}{suffix}"
    Image.fromarray(BASE).save(path, exif=exif, **({"quality": 100, "subsampling": 0} if suffix == ".jpg" else {}))
    image = read_image_rgb(path)
    expected = UPRIGHT[orientation](BASE)
    assert image.shape == expected.shape and image.flags.c_contiguous
    assert check_image(path) == (expected.shape[:2], "")
    # PNG is lossless; a JPEG at quality 100 without subsampling comes back within a few levels (JPEG_LEVELS),
    # while a wrong turn moves the stripes and the gradients by far more.
    difference = np.abs(image.astype(np.int16) - expected).max()
    assert difference <= (0 if suffix == ".png" else JPEG_LEVELS), (orientation, difference)


def _png_with_chunk_after_pixels(path: Path, pixels: np.ndarray, kind: bytes, data: bytes) -> None:
    """A PNG of ``pixels`` with one ``kind`` chunk between its last IDAT and IEND, where the PNG specification
    allows an eXIf or a text chunk and Pillow reads it only as it decodes the pixels."""
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    png = buffer.getvalue()
    chunk = len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")
    end = png.rindex(b"IEND") - 4  # IEND's length field
    path.write_bytes(png[:end] + chunk + png[end:])


@pytest.mark.parametrize("orientation", sorted(UPRIGHT))
def test_a_png_turned_by_an_exif_chunk_after_its_pixels_is_checked_at_the_size_it_decodes_to(
    tmp_path: Path, orientation: int
):
    """The check's size is the one the boxes are scaled by: it must be the decoded image's (it was the stored one,
    and a sideways dataset scored 0 mAP without a word)."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    path = tmp_path / "late.png"
    _png_with_chunk_after_pixels(path, BASE, b"eXIf", exif.tobytes().removeprefix(b"Exif\x00\x00"))
    image = read_image_rgb(path)
    assert np.array_equal(image, UPRIGHT[orientation](BASE))
    assert check_image(path) == (image.shape[:2], "")


def test_a_png_turned_by_xmp_after_its_pixels_is_checked_at_the_size_it_decodes_to(tmp_path: Path):
    path = tmp_path / "xmp.png"
    xmp = b'<x:xmpmeta><rdf:Description tiff:Orientation="6"/></x:xmpmeta>'
    _png_with_chunk_after_pixels(path, BASE, b"iTXt", b"XML:com.adobe.xmp\x00\x00\x00\x00\x00" + xmp)
    image = read_image_rgb(path)
    assert np.array_equal(image, UPRIGHT[6](BASE))
    assert check_image(path) == (image.shape[:2], "")


JPEG_FLAVOURS = {  # Pillow's save options: the kinds of JPEG that datasets hold
    "rgb 4:2:0": ("RGB", {"quality": 90}),
    "rgb 4:4:4": ("RGB", {"quality": 90, "subsampling": 0}),
    "progressive": ("RGB", {"quality": 75, "progressive": True}),
    "gray": ("L", {"quality": 90}),
}


@pytest.mark.parametrize("flavour", sorted(JPEG_FLAVOURS))
def test_jpegs_decode_as_pillow_decodes_them(tmp_path: Path, flavour: str):
    """Upright JPEGs are decoded by OpenCV, the rest by Pillow: the two must agree. Both wheels bundle
    libjpeg-turbo and agree exactly (0 levels here, and on BCCD, coco128 and the shapes set); another build of
    either may round its inverse DCT and chroma upsampling differently, by a few levels (JPEG_LEVELS)."""
    mode, options = JPEG_FLAVOURS[flavour]
    path = tmp_path / "image.jpg"
    Image.fromarray(BASE).convert(mode).save(path, **options)
    with Image.open(path) as image:
        expected = np.asarray(image.convert("RGB"))
    image = read_image_rgb(path)
    assert image.shape == expected.shape and image.dtype == np.uint8 and image.flags.c_contiguous
    assert np.abs(image.astype(np.int16) - expected).max() <= JPEG_LEVELS, flavour


def test_a_jpeg_beyond_opencvs_pixel_limit_is_decoded_by_pillow(tmp_path: Path):
    path = tmp_path / "big.jpg"
    Image.fromarray(BASE).save(path, quality=90)
    code = ("import sys, numpy as np; from pathlib import Path; from PIL import Image; "
            "from detector.data.images import read_image_rgb; "
            "expected = np.asarray(Image.open(sys.argv[1]).convert('RGB')); "
            "assert np.array_equal(read_image_rgb(Path(sys.argv[1])), expected)")
    # OpenCV reads its limit from the environment when it loads: 1,000 pixels makes it refuse this 64x48 image.
    environment = {**os.environ, "OPENCV_IO_MAX_IMAGE_PIXELS": "1000"}
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, env=environment, timeout=60)


def test_sixteen_bit_gray_keeps_its_brightness_instead_of_stretching_to_its_maximum(tmp_path: Path):
    dark = np.full((8, 8), 1000, np.uint16)  # 1000 / 257 = 3.9: a dark image stays dark
    dark[0, 0] = 2570
    cv2.imwrite(str(tmp_path / "dark.png"), dark)
    image = read_image_rgb(tmp_path / "dark.png")
    assert image[1, 1].tolist() == [4, 4, 4] and image[0, 0].tolist() == [10, 10, 10]


def test_read_image_names_the_file_in_one_line(tmp_path: Path):
    (tmp_path / "bad.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    with pytest.raises(ImageError) as error:
        read_image(tmp_path / "bad.jpg")
    message = str(error.value)
    assert message.startswith(f"{tmp_path / 'bad.jpg'}: cannot decode image (") and "\n" not in message
    assert message.count(str(tmp_path)) == 1  # Pillow's own message repeats the path: said once


def test_a_zero_byte_image_is_said_alike_by_the_scan_and_by_predict(tmp_path: Path):
    (tmp_path / "empty.jpg").write_bytes(b"")
    (tmp_path / "text.jpg").write_bytes(b"just words")
    assert check_image(tmp_path / "empty.jpg") == (None, "zero-byte file")
    with pytest.raises(ImageError, match=r"empty\.jpg: cannot decode image \(zero-byte file\)$"):
        read_image(tmp_path / "empty.jpg")
    size, reason = check_image(tmp_path / "text.jpg")
    assert size is None and reason == "cannot identify image file"  # without the path Pillow puts in it


def test_a_folder_named_like_an_image_is_said_to_be_a_folder(tmp_path: Path):
    """A .txt list may name a folder (images/odd.jpg/): its reason says so, not the OS's errno text."""
    (tmp_path / "odd.jpg").mkdir()
    assert check_image(tmp_path / "odd.jpg") == (None, "a folder, not an image file")


def test_a_dataset_of_every_mode_scans_clean_and_trains_one_epoch(tmp_path: Path):
    yaml = write_yolo_dataset(tmp_path / "modes", train=2, val=1)
    images, labels = tmp_path / "modes/images/train", tmp_path / "modes/labels/train"
    for mode in MODES:
        path, _, _ = _write(images, mode)
        (labels / f"{path.stem}.txt").write_text("0 0.5 0.5 0.5 0.5\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records, _, _ = load_records(load_dataset_spec(yaml), "train")
    assert len(records) == 2 + len(MODES) and not caught
    summary = train(TrainConfig(data=str(yaml), device="cpu", imgsz=64, epochs=1, batch=4, workers=0, cache="ram",
                                project=str(tmp_path / "runs"), plots=False, amp_check=False), progress=False)
    assert summary["epochs_done"] == 1
