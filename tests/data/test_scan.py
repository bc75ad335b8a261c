"""The split scan: labels and checks cached beside the data, only changed files scanned again, bad COCO
annotations summarised, read-only folders and corrupt caches handled."""

import json
import os
import warnings
from pathlib import Path

import cv2
import numpy as np
import pytest

import detector.data.scan as scan
from detector.data import problems
from detector.data.spec import load_dataset_spec
from tests.conftest import write_coco_dataset, write_yolo_dataset


@pytest.fixture
def counted_checks(monkeypatch) -> list[Path]:
    """Every image the scan opens, in order."""
    opened: list[Path] = []
    original = scan.check_image
    monkeypatch.setattr(scan, "check_image", lambda path: opened.append(path) or original(path))
    return opened


def _touch_later(path: Path) -> None:
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


def test_second_scan_opens_nothing_and_changed_files_are_scanned_again(tmp_path: Path, counted_checks: list[Path]):
    spec = load_dataset_spec(write_yolo_dataset(tmp_path / "d", train=6, val=2))
    first = scan.scan_split(spec.train, spec.names)
    assert len(counted_checks) == 6 and first.cached_images == 0
    assert first.cache_file == tmp_path / "d" / "images" / "train.records.npz" and first.cache_file.is_file()

    counted_checks.clear()
    second = scan.scan_split(spec.train, spec.names)
    assert counted_checks == [] and second.cached_images == 6
    for name in ("path_bytes", "path_offsets", "labels", "label_offsets", "image_ids", "image_hw"):
        np.testing.assert_array_equal(getattr(second.records, name), getattr(first.records, name))

    # A changed label file is parsed again (and its image checked again); the rest comes from the cache.
    label = tmp_path / "d" / "labels" / "train" / "train_00002.txt"
    label.write_text("1 0.5 0.5 0.25 0.25\n")
    _touch_later(label)
    # A changed image is checked again: now unreadable, so it leaves the records with one summary line.
    broken = tmp_path / "d" / "images" / "train" / "train_00004.png"
    broken.write_bytes(b"not a png any more")
    third = scan.scan_split(spec.train, spec.names)
    assert sorted(p.name for p in counted_checks) == ["train_00002.png", "train_00004.png"]
    names = [r.path.name for r in third.records]
    assert "train_00004.png" not in names and len(names) == 5
    np.testing.assert_allclose(third.records[names.index("train_00002.png")].labels, [[1, 0.5, 0.5, 0.25, 0.25]])
    assert [line.split(":")[0] for line in third.problems.lines()] == [f"1 {problems.UNREADABLE_IMAGE}, in 1 file(s)"]

    # An added image is the only one scanned; listing order is kept.
    counted_checks.clear()
    cv2.imwrite(str(tmp_path / "d" / "images" / "train" / "train_00002b.png"), np.zeros((32, 48, 3), np.uint8))
    spec = load_dataset_spec(spec.yaml_path)
    fourth = scan.scan_split(spec.train, spec.names)
    assert [p.name for p in counted_checks] == ["train_00002b.png"]
    assert [r.path.name for r in fourth.records][:4] == ["train_00000.png", "train_00001.png", "train_00002.png",
                                                         "train_00002b.png"]
    assert fourth.records.hw_list()[3] == (32, 48)


def test_corrupt_or_foreign_cache_is_rebuilt(tmp_path: Path, counted_checks: list[Path]):
    spec = load_dataset_spec(write_yolo_dataset(tmp_path / "d", train=3, val=1))
    cache_file = scan.scan_split(spec.train, spec.names).cache_file
    cache_file.write_bytes(b"PK\x03\x04 half a zip")
    counted_checks.clear()
    again = scan.scan_split(spec.train, spec.names)
    assert len(counted_checks) == 3 and len(again.records) == 3
    counted_checks.clear()
    other_classes = scan.scan_split(spec.train, spec.names + ["extra"])  # other settings: not trusted
    assert len(counted_checks) == 3 and len(other_classes.records) == 3


def _forge(cache_file: Path, change: str) -> None:
    """Rewrite one array or entry of a records cache, its structure, version and stamps left valid."""
    with np.load(cache_file) as content:
        arrays = {key: content[key] for key in content.files}
    meta = json.loads(arrays["meta"].tobytes())
    labels = arrays["labels"]  # float32 [N, 5]: class, cx, cy, w, h
    if change == "class 99":
        labels[0, 0] = 99
    elif change == "nan box":
        labels[0, 1] = np.nan
    elif change == "box past the edge":
        labels[0, 3] = 1.5
    elif change == "offsets past the end":
        arrays["label_offsets"][-1] += 5
    elif change == "offsets out of order":
        arrays["label_offsets"][1], arrays["label_offsets"][2] = arrays["label_offsets"][2], arrays["label_offsets"][1]
    elif change == "problem of image 7":
        meta["image_problems"].append([7, "forged", "x", 1])
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    np.savez(cache_file, **arrays)


@pytest.mark.parametrize("change", ["class 99", "nan box", "box past the edge", "offsets past the end",
                                    "offsets out of order", "problem of image 7"])
def test_a_cache_whose_contents_the_scan_could_not_have_written_is_scanned_anew(
    tmp_path: Path, counted_checks: list[Path], capsys, change: str
):
    """A forged cache of the right version and shape was trusted: class 99 and NaN boxes trained without a word, and
    val died on an IndexError. It is checked as the parser checks labels, named in one line and rebuilt."""
    spec = load_dataset_spec(write_yolo_dataset(tmp_path / "d", train=3, val=1))
    first = scan.scan_split(spec.train, spec.names)
    assert first.records.box_counts()[:2].min() > 0  # the forgeries need boxes in the first two images
    _forge(first.cache_file, change)
    capsys.readouterr()
    counted_checks.clear()
    again = scan.scan_split(spec.train, spec.names)
    assert len(counted_checks) == 3  # every image scanned anew
    for name in ("labels", "label_offsets", "image_hw", "image_ids"):
        np.testing.assert_array_equal(getattr(again.records, name), getattr(first.records, name))
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"warning: {first.cache_file}: records cache not trusted (")
    counted_checks.clear()
    assert scan.scan_split(spec.train, spec.names).cached_images == 3 and counted_checks == []  # the rebuilt one


def test_read_only_dataset_folder_caches_in_the_user_cache(tmp_path: Path, monkeypatch, counted_checks: list[Path]):
    spec = load_dataset_spec(write_yolo_dataset(tmp_path / "d", train=3, val=1))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))
    beside = tmp_path / "d" / "images" / "train.records.npz"
    real_write = scan.write_atomically

    def read_only_beside_data(path: Path, data: bytes) -> Path:
        if Path(path).parent == beside.parent:  # as a read-only folder answers (root ignores chmod)
            raise PermissionError(13, "Read-only file system", str(path))
        return real_write(path, data)

    monkeypatch.setattr(scan, "write_atomically", read_only_beside_data)
    first = scan.scan_split(spec.train, spec.names)
    assert not beside.exists() and first.cache_file.is_relative_to(tmp_path / "user-cache")
    counted_checks.clear()
    assert scan.scan_split(spec.train, spec.names).cached_images == 3 and counted_checks == []


def test_coco_json_is_parsed_once_and_bad_annotations_are_summarised(tmp_path: Path, monkeypatch):
    yaml = write_coco_dataset(tmp_path / "c", count=4)
    json_path = tmp_path / "c" / "instances.json"
    content = json.loads(json_path.read_text())
    first_image = content["images"][0]["id"]
    content["annotations"] += [
        {"id": 9001, "image_id": 424242, "category_id": 7, "bbox": [1, 1, 5, 5], "iscrowd": 0},
        {"id": 9002, "image_id": 424243, "category_id": 7, "bbox": [1, 1, 5, 5], "iscrowd": 0},
        {"id": 9003, "image_id": first_image, "category_id": 99, "bbox": [1, 1, 5, 5], "iscrowd": 0},
        {"id": 9004, "image_id": first_image, "category_id": 7, "bbox": [1, 1, 5], "iscrowd": 0},
        {"id": 9005, "image_id": first_image, "category_id": 9, "bbox": [50, 50, 30, 30], "iscrowd": 0},
    ]
    content["images"].append({"id": 555, "file_name": "missing.jpg", "width": 64, "height": 64})
    json_path.write_text(json.dumps(content))
    spec = load_dataset_spec(yaml)
    parsed = []
    original = scan.read_coco_labels
    monkeypatch.setattr(scan, "read_coco_labels", lambda *a: parsed.append(a) or original(*a))
    first = scan.scan_split(spec.train, spec.names)
    lines = first.problems.lines()
    assert len(parsed) == 1 and len(first.records) == 4 and len(lines) == 5
    # both annotations are places in one file, the JSON
    assert f"2 {problems.MISSING_IMAGE_ENTRY}, in 1 file(s)" in lines[0] and "annotation 9001" in lines[0]
    assert f"1 {problems.UNKNOWN_CATEGORY}" in lines[1] and f"1 {problems.BAD_BBOX}" in lines[2]
    assert f"1 {problems.CLIPPED_FAR}, in 1 file(s): 000.jpg" in lines[3]  # 16 px past a 64-px image
    assert f"1 {problems.UNREADABLE_IMAGE}" in lines[4] and "missing.jpg (file not found)" in lines[4]
    clipped = first.records[0].labels[-1]  # [50, 80] x [50, 80] on a 64 px image -> [50, 64] x [50, 64]
    np.testing.assert_allclose(clipped, [1, 57 / 64, 57 / 64, 14 / 64, 14 / 64], rtol=1e-6)

    second = scan.scan_split(spec.train, spec.names)
    assert len(parsed) == 1 and second.cached_images == 4  # the JSON is not read again (a missing file is looked for)
    assert second.problems.lines() == lines and second.category_ids == [7, 9, 11]
    np.testing.assert_array_equal(second.records.labels, first.records.labels)
    _touch_later(json_path)
    scan.scan_split(spec.train, spec.names)
    assert len(parsed) == 2


def test_load_records_warns_one_line_per_kind(tmp_path: Path):
    from detector.data.build import load_records

    root = tmp_path / "d"
    yaml = write_yolo_dataset(root, train=5, val=1)
    for index in range(5):  # every file with a slightly-out box: one line for all of them, not five
        (root / "labels" / "train" / f"train_{index:05d}.txt").write_text("0 0.99 0.5 0.04 0.2\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_records(load_dataset_spec(yaml), "train")
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and f"5 {problems.CLIPPED}, in 5 file(s)" in messages[0]
    assert messages[0].endswith(f"... (2 more; every one in {root / 'images' / 'train.problems.txt'})")


def test_a_large_coco_json_is_parsed_in_a_child_process_to_the_same_records(tmp_path: Path, monkeypatch):
    yaml = write_coco_dataset(tmp_path / "c", count=4)
    spec = load_dataset_spec(yaml)
    in_process = scan.scan_split(spec.train, spec.names)
    for cache in tmp_path.rglob("*" + scan.SUFFIX):
        cache.unlink()
    monkeypatch.setattr(scan, "JSON_IN_CHILD_BYTES", 0)  # every JSON counts as large
    parsed_by = tmp_path / "parsed-by"  # a file: a list appended to in a child would stay the child's
    original = scan.read_coco_labels
    monkeypatch.setattr(scan, "read_coco_labels", lambda *a: parsed_by.write_text(str(os.getpid())) and original(*a))
    in_child = scan.scan_split(spec.train, spec.names)
    assert int(parsed_by.read_text()) != os.getpid()
    assert in_child.records.arrays().keys() == in_process.records.arrays().keys()
    for name, array in in_process.records.arrays().items():
        np.testing.assert_array_equal(in_child.records.arrays()[name], array, err_msg=name)
    assert in_child.category_ids == in_process.category_ids
    assert in_child.problems.lines() == in_process.problems.lines()


def test_a_moved_coco_dataset_and_another_images_folder_are_listed_anew(tmp_path: Path):
    """The listing a COCO JSON's cache holds has absolute paths: a dataset moved with its cache (``mv``, ``cp -a``)
    read its images at the old place ('file not found', then no readable image), and the same JSON beside another
    images folder kept reading the first one."""
    import shutil

    yaml = write_coco_dataset(tmp_path / "a", count=4)
    spec = load_dataset_spec(yaml)
    assert len(scan.scan_split(spec.train, spec.names).records) == 4  # cached beside the JSON
    shutil.move(tmp_path / "a", tmp_path / "moved")
    moved = load_dataset_spec(tmp_path / "moved" / "coco.yaml")
    result = scan.scan_split(moved.train, moved.names)
    assert [path.parent for path in result.records.paths()] == [tmp_path / "moved" / "images"] * 4
    assert not result.problems.entries
    shutil.copytree(tmp_path / "moved" / "images", tmp_path / "moved" / "other")
    (tmp_path / "moved" / "other.yaml").write_text(
        (tmp_path / "moved" / "coco.yaml").read_text().replace("images: images}", "images: other}"))
    other = load_dataset_spec(tmp_path / "moved" / "other.yaml")
    assert {path.parent for path in scan.scan_split(other.train, other.names).records.paths()} == {
        tmp_path / "moved" / "other"}


def test_a_cached_coco_listing_does_not_answer_for_names_in_another_order(tmp_path: Path):
    """The category-name check ran only when the JSON was parsed: after one run cached it, a YAML naming the same
    classes in another order was accepted, and its table put each class's rows under another name."""
    from detector.data.spec import DatasetError

    yaml = write_coco_dataset(tmp_path / "a", count=4)
    spec = load_dataset_spec(yaml)
    assert len(scan.scan_split(spec.train, spec.names).records) == 4  # cached beside the JSON
    swapped = [spec.names[1], spec.names[0], *spec.names[2:]]
    with pytest.raises(DatasetError, match="its categories in id order are"):
        scan.scan_split(spec.train, swapped)
    with pytest.raises(DatasetError, match="its categories in id order are"):  # twice: nothing cached for it
        scan.scan_split(spec.train, swapped)


def test_yolo_layout_ids_are_cocos_own_where_the_files_and_classes_are_cocos():
    """A YOLO-layout COCO (coco128, COCO in Ultralytics' layout): image 000000000009.jpg is id 9 and person..
    toothbrush keep COCO's category ids 1..90, so predictions.json scores against COCO's JSON (it held 0, 1, ...
    and 1..80, which pycocotools refused); elsewhere positions and 1, 2, ..."""
    from detector.data.scan import COCO_CATEGORY_IDS, coco_names, yolo_category_ids, yolo_image_ids

    assert yolo_image_ids([Path("a/000000000009.jpg"), Path("b/000000000025.png")]).tolist() == [9, 25]
    for paths in ([Path("9.jpg"), Path("a.jpg")], [Path("a/007.jpg"), Path("b/7.jpg")], [Path("²3.jpg")]):
        assert yolo_image_ids(paths).tolist() == list(range(len(paths)))  # a name no number, two alike, not ASCII
    names = list(coco_names())
    assert len(names) == 80 and names[:3] == ["person", "bicycle", "car"] and names[-1] == "toothbrush"
    assert yolo_category_ids(names) == COCO_CATEGORY_IDS and COCO_CATEGORY_IDS[-1] == 90
    assert len(set(COCO_CATEGORY_IDS)) == 80 and 12 not in COCO_CATEGORY_IDS
    assert yolo_category_ids(["cat", "dog"]) == [1, 2] and yolo_category_ids(names[:79]) == list(range(1, 80))


def test_a_turned_image_whose_json_lists_its_stored_size_is_skipped_with_its_name(tmp_path: Path):
    """A JPEG shown turned by EXIF (orientation 6) with a JSON in its stored 96x64 pixels (a tool that ignores EXIF):
    decoded upright (64 wide, 96 tall) its boxes landed elsewhere, trained and scored with no word. The same image
    listed at its upright size is read as it always was."""
    from PIL import Image

    from detector.data.problems import SIDEWAYS_JSON

    root = tmp_path / "turned"
    (root / "images").mkdir(parents=True)
    exif = Image.Exif()
    exif[0x0112] = 6
    for name in ("stored.jpg", "upright.jpg"):
        Image.new("RGB", (96, 64), (120, 60, 30)).save(root / "images" / name, exif=exif)
    coco = {"images": [{"id": 1, "file_name": "stored.jpg", "width": 96, "height": 64},
                       {"id": 2, "file_name": "upright.jpg", "width": 64, "height": 96}],
            "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [10, 10, 20, 20], "iscrowd": 0},
                            {"id": 2, "image_id": 2, "category_id": 1, "bbox": [10, 10, 20, 20], "iscrowd": 0}],
            "categories": [{"id": 1, "name": "thing"}]}
    (root / "coco.json").write_text(json.dumps(coco))
    (root / "data.yaml").write_text("train: {json: coco.json, images: images}\nval: {json: coco.json, images: images}\n"
                                    "names: [thing]\n")
    spec = load_dataset_spec(root / "data.yaml")
    for _ in range(2):  # parsed, then answered from the cache: the same verdict
        result = scan.scan_split(spec.train, spec.names)
        assert [path.name for path in result.records.paths()] == ["upright.jpg"]
        assert result.problems.entries and result.problems.entries[0][:2] == (SIDEWAYS_JSON,
                                                                             str(root / "images" / "stored.jpg"))
