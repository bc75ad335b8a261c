"""COCO JSON and YOLO txt labels given numbers and shapes they should never hold (detector/data/labels.py).

Python's JSON reader accepts ``NaN`` and ``Infinity``; a width of 0 would divide every box by zero; a
missing key was a KeyError traceback; a ``file_name`` of ``../x.jpg`` named a file outside the image folder.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from detector.data import problems as kinds
from detector.data.build import build_split
from detector.data.ground_truth import load_coco
from detector.data.labels import parse_yolo_label_text, read_coco_labels
from detector.data.spec import DatasetError, load_dataset_spec
from tests.conftest import NAMES, write_coco_dataset


def _coco(root: Path) -> tuple[Path, dict]:
    write_coco_dataset(root)
    json_path = root / "instances.json"
    return json_path, json.loads(json_path.read_text())


def _write(json_path: Path, coco: dict | list) -> None:
    json_path.write_text(json.dumps(coco))  # allow_nan: writes NaN and Infinity, as some tools do


def _found(problems) -> dict[str, int]:
    totals: dict[str, int] = {}
    for kind, _, count in problems.entries:
        totals[kind] = totals.get(kind, 0) + count
    return totals


def test_non_finite_negative_and_ill_typed_boxes_are_dropped_and_counted(tmp_path: Path):
    json_path, coco = _coco(tmp_path)
    first = coco["annotations"][0]
    hostile = [[math.nan, 10, 20, 20], [10, math.inf, 20, 20], [10, 10, -5, 20], [10, 10, 20, True],
               [10, 10, "20", 20], None]
    for index, bbox in enumerate(hostile):
        coco["annotations"].append({**first, "id": 1000 + index, "bbox": bbox})
    coco["annotations"].append({**first, "id": 2000, "image_id": [1]})  # unhashable: was a TypeError
    coco["annotations"].append({**first, "id": 2001, "category_id": math.nan})
    _write(json_path, coco)
    assert "NaN" in json_path.read_text() and "Infinity" in json_path.read_text()
    parsed = read_coco_labels(json_path, tmp_path / "images", NAMES)
    assert _found(parsed.problems) == {kinds.BAD_BBOX: len(hostile), kinds.MISSING_IMAGE_ENTRY: 1,
                                       kinds.UNKNOWN_CATEGORY: 1}
    labels = np.concatenate(parsed.labels)
    assert np.isfinite(labels).all() and len(labels) == len(coco["annotations"]) - len(hostile) - 2


@pytest.mark.parametrize("size", [{"width": 0}, {"height": -3}, {"width": math.nan}, {"height": math.inf},
                                  {"width": "64"}, {"width": None}])
def test_an_image_of_impossible_size_is_skipped_and_counted(tmp_path: Path, size: dict):
    json_path, coco = _coco(tmp_path)
    coco["images"][1].update(size)
    _write(json_path, coco)
    parsed = read_coco_labels(json_path, tmp_path / "images", NAMES)
    assert parsed.image_ids.tolist() == [100, 102, 103]
    assert parsed.problems.entries == [(kinds.BAD_IMAGE_SIZE, f"{json_path} (image 101)", 1)]
    assert all(np.isfinite(labels).all() for labels in parsed.labels)


def test_images_of_impossible_size_are_one_line_counting_one_file(tmp_path: Path):
    json_path, coco = _coco(tmp_path)
    for image in coco["images"][:3]:
        image["width"] = 0
    _write(json_path, coco)
    lines = read_coco_labels(json_path, tmp_path / "images", NAMES).problems.lines()
    assert lines == [f"3 {kinds.BAD_IMAGE_SIZE}, in 1 file(s): {json_path} (image 100), {json_path} (image 101), "
                     f"{json_path} (image 102)"]


@pytest.mark.parametrize(("section", "key"), [("images", "width"), ("images", "height"), ("images", "file_name"),
                                              ("images", "id"), ("categories", "id")])
def test_a_missing_key_is_one_line_naming_the_file_the_entry_and_the_key(tmp_path: Path, section: str, key: str):
    json_path, coco = _coco(tmp_path)
    del coco[section][1][key]
    _write(json_path, coco)
    with pytest.raises(DatasetError) as error:
        read_coco_labels(json_path, tmp_path / "images", NAMES)
    assert str(error.value) == f"{json_path}: {section}[1] has no '{key}'"


@pytest.mark.parametrize(("change", "expected"), [
    (lambda coco: [coco], "not a COCO JSON"),
    (lambda coco: {**coco, "images": {"a": 1}}, "'images' must be a list"),
    (lambda coco: {**coco, "annotations": [1, 2]}, r"annotations\[0\] must be an object"),
    (lambda coco: {**coco, "categories": [{"id": "seven"}, *coco["categories"][1:]]}, "'id' must be an integer"),
    (lambda coco: {**coco, "images": [{**coco["images"][0], "id": [1]}]}, "'id' must be an integer"),
    (lambda coco: {**coco, "images": [{**coco["images"][0], "file_name": 5}]}, "'file_name' must be text"),
])
def test_a_json_of_the_wrong_shape_is_one_line_naming_the_file(tmp_path: Path, change, expected: str):
    json_path, coco = _coco(tmp_path)
    _write(json_path, change(coco))
    with pytest.raises(DatasetError, match=expected) as error:
        read_coco_labels(json_path, tmp_path / "images", NAMES)
    assert str(error.value).startswith(f"{json_path}: ") and "\n" not in str(error.value)


@pytest.mark.parametrize("name", ["../outside.jpg", "sub/../../outside.jpg", "/etc/outside.jpg", "..\\outside.jpg",
                                  "C:\\outside.jpg", ""])
def test_a_file_name_leaving_the_image_folder_is_refused_naming_the_image(tmp_path: Path, name: str):
    json_path, coco = _coco(tmp_path / "d")
    (tmp_path / "d" / "outside.jpg").write_bytes((tmp_path / "d/images/000.jpg").read_bytes())
    coco["images"][2]["file_name"] = name
    _write(json_path, coco)
    with pytest.raises(DatasetError) as error:
        read_coco_labels(json_path, tmp_path / "d/images", NAMES)
    assert str(error.value).startswith(f"{json_path}: images[2] (id 102) 'file_name' {name!r} ")


def test_a_subfolder_file_name_and_integral_float_ids_are_fine(tmp_path: Path):
    json_path, coco = _coco(tmp_path)
    (tmp_path / "images/sub").mkdir()
    (tmp_path / "images/000.jpg").rename(tmp_path / "images/sub/000.jpg")
    coco["images"][0]["file_name"] = "sub/000.jpg"
    coco["categories"][0]["id"] = 7.0
    _write(json_path, coco)
    parsed = read_coco_labels(json_path, tmp_path / "images", NAMES)
    assert parsed.paths[0] == tmp_path / "images/sub/000.jpg" and parsed.category_ids == [7, 9, 11]
    assert not parsed.problems.entries


def test_evaluation_ground_truth_leaves_out_what_training_drops(tmp_path: Path):
    yaml = write_coco_dataset(tmp_path)
    json_path = tmp_path / "instances.json"
    coco = json.loads(json_path.read_text())
    good = len(coco["annotations"])
    first = coco["annotations"][0]
    coco["annotations"] += [{**first, "id": 900, "bbox": [math.nan, 1, 2, 2]}, {**first, "id": 901, "bbox": None}]
    for ann in coco["annotations"][:2]:
        del ann["area"], ann["iscrowd"]  # pycocotools' evaluation reads both
    coco["annotations"][2]["id"] = coco["annotations"][3]["id"]  # a repeated id
    _write(json_path, coco)
    ground_truth = load_coco(json_path)
    anns = ground_truth.dataset["annotations"]
    assert len(anns) == good and len({a["id"] for a in anns}) == good
    assert all(np.isfinite(a["bbox"]).all() and a["area"] >= 0 and a["iscrowd"] == 0 for a in anns)
    split = build_split(load_dataset_spec(yaml), "val", image_size=64, augment=None, cache="none")
    assert len(split.ground_truth.getAnnIds()) == good


def test_yolo_values_past_float32_range_are_dropped_not_turned_into_nan():
    # 1e39 is finite as float64 and inf as float32: cx - w / 2 was inf - inf = NaN, which passed every check
    text = "0 1e39 0.5 1e39 0.2\n0 0.5 0.5 1e39 1e39\n1 0.5 0.5 0.2 0.2\n2 nan 0.5 0.1 0.1\n2 0.5 0.5 inf 0.1\n"
    labels, problems = parse_yolo_label_text(text, num_classes=3, source="x.txt")
    assert labels.tolist() == [[1, 0.5, 0.5, 0.20000000298023224, 0.20000000298023224]]
    assert _found(problems) == {kinds.FAR_OUTSIDE: 2, kinds.NOT_NUMERIC: 2}


def test_a_label_file_that_cannot_be_read_skips_its_image_with_one_line(tmp_path: Path):
    import os
    import warnings

    from detector.data.build import load_records
    from tests.conftest import write_yolo_dataset

    yaml = write_yolo_dataset(tmp_path / "d", train=4, val=2)
    labels = tmp_path / "d/labels/train"
    (labels / "train_00001.txt").unlink()
    (labels / "train_00001.txt").mkdir()  # a folder where the label file should be
    (labels / "train_00002.txt").unlink()
    os.mkfifo(labels / "train_00002.txt")  # opening a pipe to read waits for a writer: never opened
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records, _, _ = load_records(load_dataset_spec(yaml), "train")
    assert [p.name for p in records.paths()] == ["train_00000.png", "train_00003.png"]
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and f"2 {kinds.UNREADABLE_LABELS}, in 2 file(s): " in messages[0]
    assert f"{labels / 'train_00001.txt'} (not a regular file)" in messages[0]


def test_a_coco_dataset_with_nan_boxes_and_an_empty_image_trains_and_scores_finite(tmp_path: Path):
    """End to end: the NaN and Infinity boxes and the width-0 image are dropped with their summary lines, no
    label the loader hands out holds a NaN, and the run trains and scores finite numbers. (In this tiny CPU
    run a NaN label did not make the loss non-finite; what matters is that no NaN label exists at all.)"""
    import csv
    import warnings

    from detector.data.build import load_records
    from detector.training.config import TrainConfig
    from detector.training.trainer import train

    yaml = write_coco_dataset(tmp_path, count=6)
    json_path = tmp_path / "instances.json"
    coco = json.loads(json_path.read_text())
    coco["annotations"][0]["bbox"] = [math.nan, 10, 20, 20]
    coco["annotations"][1]["bbox"] = [10, 10, math.inf, 20]
    coco["images"][5]["width"] = 0
    _write(json_path, coco)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = train(TrainConfig(data=str(yaml), device="cpu", imgsz=64, epochs=1, batch=3, workers=0,
                                    cache="none", project=str(tmp_path / "runs"), plots=False, amp_check=False),
                        progress=False)
    messages = [str(w.message) for w in caught]
    records, _, _ = load_records(load_dataset_spec(yaml), "train")
    assert len(records) == 5 and np.isfinite(records.labels).all()
    assert any(f"2 {kinds.BAD_BBOX}" in m for m in messages) and any(kinds.BAD_IMAGE_SIZE in m for m in messages)
    with open(Path(summary["run_dir"]) / "results.csv") as file:
        row = next(csv.DictReader(file))
    assert int(float(row["nonfinite_losses"])) == 0 and int(float(row["skipped_steps"])) == 0
    assert all(math.isfinite(value) for value in summary["metrics"].values())


def test_an_image_id_two_entries_share_is_one_line_naming_both(tmp_path: Path):
    """A JSON merged from two exports, each numbered from 1: the last entry with an id took the first one's boxes
    and the first photo went, without a word."""
    json_path, coco = _coco(tmp_path)
    coco["images"][2]["id"] = coco["images"][0]["id"]
    _write(json_path, coco)
    with pytest.raises(DatasetError, match=r"images\[2\] has the id 100 of images\[0\]: each image needs an id"):
        read_coco_labels(json_path, tmp_path / "images", NAMES)


@pytest.mark.parametrize("section", ["images", "categories"])
def test_ids_beyond_2_53_are_one_line(tmp_path: Path, section: str):
    """Image and category ids reach the evaluators as float64: 10**17 + 1 became 10**17 (a traceback from
    faster-coco-eval, a wrong mAP from pycocotools)."""
    json_path, coco = _coco(tmp_path)
    old = coco[section][1]["id"]
    coco[section][1]["id"] = 10**17 + 1
    for ann in coco["annotations"]:
        key = "image_id" if section == "images" else "category_id"
        ann[key] = 10**17 + 1 if ann[key] == old else ann[key]
    _write(json_path, coco)
    with pytest.raises(DatasetError, match=rf"{section}\[1\] 'id' 100000000000000001 is beyond 2\*\*53"):
        read_coco_labels(json_path, tmp_path / "images", NAMES)


def test_category_names_in_another_order_than_the_ids_are_refused_and_other_names_counted(tmp_path: Path):
    """Class i is the JSON's i-th category by id: names listed in the file's order (not by id) named RBC boxes
    'Platelets'; a train and a val JSON numbering the same categories differently swapped classes silently."""
    json_path, coco = _coco(tmp_path)  # categories 7 circle, 9 square, 11 triangle
    swapped = [NAMES[1], NAMES[0], NAMES[2]]
    with pytest.raises(DatasetError, match=r"its categories in id order are circle, square, triangle, but the "
                                           r"classes are named square, circle, triangle: class i is"):
        read_coco_labels(json_path, tmp_path / "images", swapped)
    parsed = read_coco_labels(json_path, tmp_path / "images", ["a", "b", "c"])  # renamed classes: said, not refused
    assert _found(parsed.problems) == {kinds.OTHER_CATEGORY_NAMES: 1}
    assert not read_coco_labels(json_path, tmp_path / "images", NAMES).problems.entries


def test_a_listed_image_without_an_image_suffix_is_counted(tmp_path: Path):
    json_path, coco = _coco(tmp_path)
    coco["images"][0]["file_name"] = "000"
    _write(json_path, coco)
    parsed = read_coco_labels(json_path, tmp_path / "images", NAMES)
    assert _found(parsed.problems) == {kinds.NOT_AN_IMAGE_NAME: 1} and len(parsed.paths) == 3


@pytest.mark.parametrize("backend", ["faster", "pycocotools"])
@pytest.mark.parametrize("ids", [None, (0, 1), (5, 5)], ids=["no ids", "from 0", "repeated"])
def test_annotations_without_usable_ids_are_found_by_both_evaluators(tmp_path: Path, backend: str, ids):
    """Detections exactly on the two boxes score 1.0 whatever the annotations' ids: missing or repeated ids were
    given negative ones, which faster-coco-eval's matching never matches (mAP 0), and an id of 0 (Roboflow's first)
    made a perfect match a false positive in both evaluators (0.252)."""
    from detector.metrics.coco import evaluate_coco

    boxes = [[10.0, 10.0, 20.0, 30.0], [50.0, 40.0, 25.0, 15.0]]
    annotations = [{"image_id": 1, "category_id": 3, "bbox": box, "area": box[2] * box[3], "iscrowd": 0}
                   for box in boxes]
    for ann, ann_id in zip(annotations, ids or ()):
        ann["id"] = ann_id
    json_path = tmp_path / "gt.json"
    _write(json_path, {"images": [{"id": 1, "file_name": "a.jpg", "width": 100, "height": 100}],
                       "annotations": annotations, "categories": [{"id": 3, "name": "cell"}]})
    detections = np.array([[1, *box, 0.9, 3] for box in boxes], np.float64)
    ground_truth = load_coco(json_path)
    assert all(ann["id"] > 0 for ann in ground_truth.dataset["annotations"])
    result = evaluate_coco(ground_truth, detections, backend=backend, processes=False)
    assert result.metrics["mAP50"] == pytest.approx(1.0) and result.metrics["mAP50-95"] == pytest.approx(1.0)


def test_images_resized_after_annotation_are_scored_in_the_jsons_pixels(tmp_path: Path, capsys):
    """A JSON listing 64x64 images whose files are 32x32 now: training reads normalised boxes (right either way),
    but the evaluation's ground truth is in the JSON's pixels and the detections were in the file's, so every box
    missed (mAP 0.000, no word). The split now carries the scale, and the loop applies it."""
    import cv2

    from detector.metrics.loop import in_json_pixels

    yaml = write_coco_dataset(tmp_path, count=3)
    for name in ("000.jpg", "001.jpg"):
        image = cv2.imread(str(tmp_path / "images" / name))
        cv2.imwrite(str(tmp_path / "images" / name), cv2.resize(image, (32, 32)))
    image = cv2.imread(str(tmp_path / "images" / "002.jpg"))
    cv2.imwrite(str(tmp_path / "images" / "002.jpg"), cv2.resize(image, (64, 32)))  # another shape: named only
    split = build_split(load_dataset_spec(yaml), "val", image_size=64, augment=None, cache="none")
    assert split.json_scale == {100: 2.0, 101: 2.0}
    err = capsys.readouterr().err
    assert "2 image(s) are another size than their JSON entry says (e.g. 000.jpg: 64x64 listed)" in err
    assert "1 image(s) differ in shape from their JSON entry (no one scale maps one onto the other): their " \
           "detections are scored as read, against boxes drawn on another picture: 002.jpg" in err
    rows = np.array([[100, 1.0, 2.0, 3.0, 4.0, 0.5, 7], [102, 1.0, 2.0, 3.0, 4.0, 0.5, 9]])
    assert in_json_pixels(rows, split.json_scale).tolist() == [[100, 2.0, 4.0, 6.0, 8.0, 0.5, 7], rows[1].tolist()]
    written = write_coco_dataset(tmp_path / "same", count=2)
    assert build_split(load_dataset_spec(written), "val", image_size=64, augment=None, cache="none").json_scale is None


def test_a_windows_file_name_with_backslashes_is_read_as_a_path(tmp_path: Path):
    json_path, coco = _coco(tmp_path)
    (tmp_path / "images/sub").mkdir()
    (tmp_path / "images/000.jpg").rename(tmp_path / "images/sub/000.jpg")
    coco["images"][0]["file_name"] = "sub\\000.jpg"
    _write(json_path, coco)
    parsed = read_coco_labels(json_path, tmp_path / "images", NAMES)
    assert parsed.paths[0] == tmp_path / "images/sub/000.jpg" and not parsed.problems.entries


@pytest.mark.parametrize("layout", ["yolo", "coco"])
def test_single_class_counts_every_box_as_one_class_in_labels_and_ground_truth(tmp_path: Path, layout: str):
    """train --single-cls (Ultralytics' single_cls): the label files are read against the YAML's names (no box
    dropped as an unknown class), then every box is class 0, 'item', and the ground truth scored against has the
    same boxes in one category."""
    from detector.data.spec import single_class
    from tests.conftest import write_yolo_dataset

    yaml = write_coco_dataset(tmp_path, count=4) if layout == "coco" else write_yolo_dataset(tmp_path, train=2, val=4)
    spec = load_dataset_spec(yaml)
    every = build_split(spec, "val", image_size=64, augment=None)
    one = build_split(single_class(spec), "val", image_size=64, augment=None)
    assert single_class(spec).names == ["item"] and single_class(single_class(spec)).names == ["item"]
    assert len(set(every.records.labels[:, 0].tolist())) > 1  # the set has several classes to collapse
    assert (one.records.labels[:, 0] == 0).all() and len(one.category_ids) == 1
    np.testing.assert_array_equal(one.records.labels[:, 1:], every.records.labels[:, 1:])
    truth, collapsed = every.ground_truth.dataset, one.ground_truth.dataset
    assert collapsed["categories"] == [{"id": one.category_ids[0], "name": "item"}]
    assert [ann["bbox"] for ann in collapsed["annotations"]] == [ann["bbox"] for ann in truth["annotations"]]
    assert {ann["category_id"] for ann in collapsed["annotations"]} == {one.category_ids[0]}


@pytest.mark.parametrize("layout", ["yolo", "coco"])
@pytest.mark.parametrize("single", [False, True])
def test_classes_keep_only_their_boxes_in_labels_and_ground_truth(tmp_path: Path, layout: str, single: bool):
    """train --classes 0 2 (Ultralytics' classes): only those classes' boxes are trained on and scored; the class
    ids and names stay (with --single-cls too, the kept boxes then in one class). An id the YAML does not name is
    one line."""
    from detector.data.spec import only_classes, single_class
    from tests.conftest import write_yolo_dataset

    yaml = write_coco_dataset(tmp_path, count=4) if layout == "coco" else write_yolo_dataset(tmp_path, train=2, val=4)
    spec = load_dataset_spec(yaml)
    every = build_split(spec, "val", image_size=64, augment=None)
    chosen = only_classes(spec, (2, 0))
    some = build_split(single_class(chosen) if single else chosen, "val", image_size=64, augment=None)
    wanted = np.isin(every.records.labels[:, 0], (0, 2))
    assert 0 < wanted.sum() < len(wanted) and len(some.records) == len(every.records)  # images without boxes stay
    np.testing.assert_array_equal(some.records.labels[:, 1:], every.records.labels[wanted, 1:])
    expected_classes = np.zeros(wanted.sum()) if single else every.records.labels[wanted, 0]
    np.testing.assert_array_equal(some.records.labels[:, 0], expected_classes)
    kept_boxes = [ann["bbox"] for ann in every.ground_truth.dataset["annotations"]
                  if ann["category_id"] in {every.category_ids[0], every.category_ids[2]}]
    assert [ann["bbox"] for ann in some.ground_truth.dataset["annotations"]] == kept_boxes
    with pytest.raises(DatasetError, match=r"--classes 3: its names hold class ids 0 to 2"):
        only_classes(spec, (0, 3))


def test_boxes_in_pixels_are_told_that_labels_are_fractions_of_the_image():
    """A label in pixels (a converter that did not divide by the image's size) was only "centred outside the image"."""
    labels, problems = parse_yolo_label_text("0 320 240 64 48\n", num_classes=1, source="px.txt")
    assert len(labels) == 0 and _found(problems) == {kinds.FAR_OUTSIDE: 1}
    assert "fractions 0-1 of the image's width and height, not pixels" in problems.lines()[0]
