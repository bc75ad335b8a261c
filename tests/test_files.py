"""The one atomic writer: bytes, text and images appear whole or not at all; a failed image write raises."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from detector.files import atomic_file, folder_files, write_image, write_text_atomically


def test_an_error_inside_the_block_keeps_the_old_file(tmp_path: Path) -> None:
    path = write_text_atomically(tmp_path / "results.txt", "old\n")
    with pytest.raises(RuntimeError), atomic_file(path) as file:
        file.write(b"new and half")
        raise RuntimeError("disk went away")
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["results.txt"]


def test_images_are_encoded_by_suffix_and_written_whole(tmp_path: Path) -> None:
    image = np.zeros((8, 12, 3), np.uint8)
    image[2:5, 3:9] = (0, 0, 255)
    for suffix in (".png", ".jpg"):
        written = write_image(tmp_path / f"a{suffix}", image)
        read = cv2.imread(str(written))
        assert read.shape == (8, 12, 3)
    assert np.array_equal(cv2.imread(str(tmp_path / "a.png")), image)  # PNG is lossless


@pytest.mark.parametrize("name, image", [
    ("a.unknown-format", np.zeros((4, 4, 3), np.uint8)),
    ("empty.png", np.zeros((0, 0, 3), np.uint8)),
])
def test_an_image_that_cannot_be_written_raises_naming_the_file(tmp_path: Path, name: str, image) -> None:
    with pytest.raises(OSError, match=name) as failed:
        write_image(tmp_path / name, image)
    assert "\n" not in str(failed.value) and not any(tmp_path.iterdir())


def test_an_export_folder_that_cannot_be_written_is_named_not_its_hidden_staging_folder(tmp_path: Path) -> None:
    """A read-only weights folder said "[Errno 30] Read-only file system: '/ro/.export-02e9o339'"; here a file
    stands where the folder would be (root ignores read-only permissions, the tests may run as root)."""
    from detector.files import staging_folder

    (tmp_path / "weights").write_text("not a folder")
    with pytest.raises(OSError, match=r"^cannot write the export into .*weights.inner \(Not a directory\): copy the weights into a writable"):
        with staging_folder(tmp_path / "weights" / "inner"):
            pass


def test_a_link_up_the_tree_is_not_followed_and_is_named_once(tmp_path: Path, capsys) -> None:
    """``images/train/loop -> ..`` read images/val through the link (another split trained as backgrounds, without a
    word); a link to the folder itself or above it is left out with one line naming it, one beside it still read."""
    train, val, more = tmp_path / "images/train", tmp_path / "images/val", tmp_path / "more"
    for folder in (train, val, more):
        folder.mkdir(parents=True)
        (folder / f"{folder.name}.jpg").write_bytes(b"x")
    (train / "loop").symlink_to("..", target_is_directory=True)
    (train / "top").symlink_to(tmp_path, target_is_directory=True)
    (train / "itself").symlink_to(".", target_is_directory=True)
    (train / "linked").symlink_to(more, target_is_directory=True)
    assert folder_files(train) == [train / "train.jpg", train / "linked" / "more.jpg"]
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(":")[0] for line in lines] == ["warning"] * 3
    assert [line.split()[1] for line in lines] == [str(train / name) for name in ("itself", "loop", "top")]


def test_a_folder_named_like_an_image_is_read_as_a_folder(tmp_path: Path, capsys) -> None:
    """``images/train/odd.jpg/`` is a subfolder like any other: its images are read (Ultralytics' recursive glob
    reads them too, and also counts the folder itself as one corrupt image), the folder is not listed as an image."""
    (tmp_path / "odd.jpg").mkdir()
    (tmp_path / "odd.jpg" / "inside.jpg").write_bytes(b"x")
    (tmp_path / "a.jpg").write_bytes(b"x")
    not_files: list[Path] = []
    assert folder_files(tmp_path, not_files) == [tmp_path / "a.jpg", tmp_path / "odd.jpg" / "inside.jpg"]
    assert not_files == [] and capsys.readouterr().err == ""
