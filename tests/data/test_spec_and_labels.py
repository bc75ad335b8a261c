import os
from pathlib import Path

import cv2
import numpy as np
import pytest

from detector.data.build import build_split
from detector.data.labels import label_path_for, parse_yolo_label_text, read_yolo_labels
from detector.data.problems import (CLASS_OUT_OF_RANGE, CLIPPED, DUPLICATE, FAR_OUTSIDE, NOT_NUMERIC, WRONG_COLUMNS,
                                    ZERO_AREA)
from detector.data.spec import DatasetError, load_dataset_spec
from tests.conftest import NAMES, write_coco_dataset


def test_yolo_yaml_resolves_relative_to_its_folder(yolo_yaml: Path):
    spec = load_dataset_spec(yolo_yaml)
    assert spec.names == ["circle", "square", "triangle"]
    assert len(spec.train.images) == 8 and len(spec.val.images) == 4
    assert all(p.is_file() for p in spec.train.images)


def test_yolo_split_builds_with_ground_truth(yolo_yaml: Path):
    split = build_split(load_dataset_spec(yolo_yaml), "val", image_size=64, augment=None, cache="none")
    total = sum(len(r.labels) for r in split.records)
    assert total > 0 and len(split.ground_truth.getAnnIds()) == total
    image, labels, meta = split.dataset[0]
    assert image.shape == (3, 64, 64) and labels.shape[1] == 5 and meta.original_hw == (64, 64)


def test_coco_json_dataset_maps_category_ids(coco_yaml: Path):
    spec = load_dataset_spec(coco_yaml)
    split = build_split(spec, "val", image_size=64, augment=None, cache="ram")
    assert split.category_ids == [7, 9, 11]
    assert [r.image_id for r in split.records] == [100, 101, 102, 103]
    classes = np.concatenate([r.labels[:, 0] for r in split.records])
    assert set(classes.tolist()) <= {0, 1, 2} and len(classes) == len(split.ground_truth.getAnnIds())


def test_names_as_dict_and_list_file(tmp_path: Path, yolo_yaml: Path):
    listing = tmp_path / "train.txt"
    listing.write_text("\n".join(str(p) for p in sorted((yolo_yaml.parent / "images/train").iterdir())))
    yaml = tmp_path / "d.yaml"
    yaml.write_text(f"path: {yolo_yaml.parent}\ntrain: {listing}\nval: [images/val, images/train]\nnames: {{0: a, 1: b, 2: c}}\n")
    spec = load_dataset_spec(yaml)
    assert spec.names == ["a", "b", "c"] and len(spec.train.images) == 8 and len(spec.val.images) == 12


def _names_yaml(root: Path, names: str) -> Path:
    yaml = root / "names.yaml"
    yaml.write_text(f"path: .\ntrain: images/train\nval: images/val\nnames: {names}\n")
    return yaml


@pytest.mark.parametrize("names, message", [
    ("{0: a, 1.5: b, 2: c}", "'names' key 1.5 is not a class id (0, 1, 2, ...)"),  # int() would cut it to 1
    ("{0: a, ' 1': b, 2: c}", "'names' key ' 1' is not a class id (0, 1, 2, ...)"),
    ("{0: a, one: b}", "'names' key 'one' is not a class id (0, 1, 2, ...)"),
    ("{0: a, '0': b}", "'names' gives class 0 twice (keys 0 and '0')"),
    ("{0: a, 2: c}", "'names' keys must be the class ids 0..1 without gaps; no name for 1 (keys given: 0, 2)"),
])
def test_names_mapping_keys_that_are_not_class_ids_are_one_line(yolo_yaml: Path, names: str, message: str):
    """Keys were made ints to sort, then looked up as written: '01', 1.5 or ' 1' was a KeyError traceback."""
    yaml = _names_yaml(yolo_yaml.parent, names)
    with pytest.raises(DatasetError) as error:
        load_dataset_spec(yaml)
    assert str(error.value) == f"{yaml}: {message}"


def test_names_mapping_keys_may_be_written_as_text(yolo_yaml: Path):
    yaml = _names_yaml(yolo_yaml.parent, "{0: circle, '01': square, '2': triangle}")
    assert load_dataset_spec(yaml).names == ["circle", "square", "triangle"]


# An alias bomb in small: each level's list holds the one before it ten times over (YAML shares them, so the file
# reads in microseconds); turned into text, the top name was 10**4 copies of 'lol'. Nine levels made 25 MB names.
ALIAS_BOMB = "[a, &b1 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol], &b2 [" + ", ".join(["*b1"] * 10) + \
    "], &b3 [" + ", ".join(["*b2"] * 10) + "], &b4 [" + ", ".join(["*b3"] * 10) + "]]"


@pytest.mark.parametrize("names, message", [
    ("[a, null, b]", "'names' class 1 is null, not a name: each class name must be text"),  # was named 'None'
    ("[a, [b, c]]", "'names' class 1 is a list, not a name: each class name must be text"),
    ("{0: a, 1: {b: c}}", "'names' class 1 is a mapping, not a name: each class name must be text"),
    ("[a, yes]", "'names' class 1 is the boolean True (YAML reads yes, no, on, off, true and false so): put the "
                 "name in quotes"),
    (ALIAS_BOMB, "'names' class 1 is a list, not a name: each class name must be text"),
])
def test_class_names_that_are_not_text_or_numbers_are_one_line(yolo_yaml: Path, names: str, message: str):
    """Names of any type were turned into text: a null became 'None', an alias bomb's lists names of megabytes
    (a 232 MB best.pt)."""
    yaml = _names_yaml(yolo_yaml.parent, names)
    with pytest.raises(DatasetError) as error:
        load_dataset_spec(yaml)
    assert str(error.value) == f"{yaml}: {message}"


def test_numbers_name_classes_and_a_name_given_twice_is_one_warning(yolo_yaml: Path, capsys):
    assert load_dataset_spec(_names_yaml(yolo_yaml.parent, "[2020, 1.5, c]")).names == ["2020", "1.5", "c"]
    assert capsys.readouterr().err == ""
    yaml = _names_yaml(yolo_yaml.parent, "[a, a, b, b, a]")
    assert load_dataset_spec(yaml).names == ["a", "a", "b", "b", "a"]
    assert capsys.readouterr().err == (f"warning: {yaml}: 'names' gives 'a', 'b' to several classes: their results "
                                       "are told apart only by class id\n")


def test_nc_without_names_names_the_classes_as_ultralytics_does(yolo_yaml: Path, capsys):
    yaml = yolo_yaml.parent / "nc.yaml"
    yaml.write_text("path: .\ntrain: images/train\nval: images/val\nnc: 3\n")
    assert load_dataset_spec(yaml).names == ["class_0", "class_1", "class_2"]
    assert f"warning: {yaml}: no 'names', so its 3 classes are named class_0 .. class_2" in capsys.readouterr().err
    yaml.write_text("path: .\ntrain: images/train\nval: images/val\nnc: 0\n")
    with pytest.raises(DatasetError, match="'nc' must be a whole number of classes, got 0"):
        load_dataset_spec(yaml)


@pytest.mark.parametrize(
    "body, field",
    [
        ("path: .\ntrain: images/train\nval: images/val\n", "names"),
        ("path: .\nval: images/val\nnames: [a]\n", "train"),
        ("path: .\ntrain: nowhere\nval: images/val\nnames: [a]\n", "train"),
        ("path: .\ntrain: images/train\nval: images/val\nnc: 2\nnames: [a]\n", "nc"),
        ("path: missing_root\ntrain: images/train\nval: images/val\nnames: [a]\n", "path"),
        # wrong types: each a TypeError or ValueError traceback when read as a path or a number
        ("path: [1, 2]\ntrain: images/train\nval: images/val\nnames: [a]\n", "path"),
        ("path: {a: 1}\ntrain: images/train\nval: images/val\nnames: [a]\n", "path"),
        ("path: .\ntrain: [images/train, [x]]\nval: images/val\nnames: [a]\n", "train"),
        ("path: .\ntrain: 1.5\nval: images/val\nnames: [a]\n", "train"),
        ("path: .\ntrain: images/train\nval: {json: [1], images: images/val}\nnames: [a]\n", "val.json"),
        ("path: .\ntrain: images/train\nval: images/val\nnc: many\nnames: [a]\n", "nc"),
        ("path: .\ntrain: images/train\nval: images/val\nnames: {a: x, b: y}\n", "names"),
        ("path: .\ntrain: [{json: a.json, images: a}, {json: b.json, images: b}]\nval: images/val\nnames: [a]\n",
         "train"),
    ],
)
def test_broken_yaml_names_the_field(tmp_path: Path, yolo_yaml: Path, body: str, field: str):
    yaml = yolo_yaml.parent / "broken.yaml"
    yaml.write_text(body)
    with pytest.raises(DatasetError, match=f"'{field}'") as error:
        load_dataset_spec(yaml)
    assert str(yaml) in str(error.value) and "\n" not in str(error.value)


def test_label_path_convention():
    assert label_path_for(Path("/d/images/train/a.jpg")) == Path("/d/labels/train/a.txt")
    assert label_path_for(Path("/images/x/images/b.png")) == Path("/images/x/labels/b.txt")


def test_label_parsing_fixes_or_drops_bad_lines():
    text = "0 0.5 0.5 0.2 0.2\n1 0.5 0.5\n7 0.5 0.5 0.1 0.1\n0 0.96 0.5 0.1 0.1\n2 5 5 0.1 0.1\n0 0.5 0.5 0.2 0.2\n0 0.3 0.3 0 0.1\n"
    labels, problems = parse_yolo_label_text(text, num_classes=3, source="x.txt")
    assert len(labels) == 2  # the good box, and the slightly-out one clipped; duplicate removed
    assert labels[:, 1:].min() >= 0 and (labels[:, 1:3] + labels[:, 3:5] / 2).max() <= 1 + 1e-6
    found = {kind: (where, count) for kind, where, count in problems.entries}
    assert found == {
        WRONG_COLUMNS: ("x.txt:2", 1), CLASS_OUT_OF_RANGE: ("x.txt:3", 1), FAR_OUTSIDE: ("x.txt", 1),
        CLIPPED: ("x.txt", 1), DUPLICATE: ("x.txt", 1), ZERO_AREA: ("x.txt", 1),
    }


def test_polygon_lines_are_read_as_their_bounding_boxes():
    """Ultralytics' segment datasets (``class x1 y1 x2 y2 x3 y3 ...``) train a detector on the polygons' boxes, as
    Ultralytics reads them; a line with an even number of columns or fewer than 3 points is neither form."""
    text = ("1 0.2 0.3 0.6 0.3 0.6 0.7 0.2 0.7\n"  # a rectangle's 4 corners
            "0 0.5 0.5 0.2 0.2\n"  # a box beside them in the same file
            "2 0.1 0.1 0.3 0.2 0.2 0.4\n"  # a triangle: 7 columns
            "0 0.1 0.1 0.3 0.2 0.2 0.4 0.5\n"  # 8 columns: half a point
            "0 0.1 0.1 nan 0.2 0.2 0.4\n"  # a non-finite point
            "0 0.1 0.1 x 0.2 0.2 0.4\n")  # a word
    labels, problems = parse_yolo_label_text(text, num_classes=3, source="x.txt")
    np.testing.assert_allclose(labels, [[1, 0.4, 0.5, 0.4, 0.4], [0, 0.5, 0.5, 0.2, 0.2], [2, 0.2, 0.25, 0.2, 0.3]],
                               atol=1e-6)
    assert sorted(problems.entries) == sorted([(WRONG_COLUMNS, "x.txt:4", 1), (NOT_NUMERIC, "x.txt:5", 1),
                                               (NOT_NUMERIC, "x.txt:6", 1)])


def test_a_label_file_s_byte_order_mark_is_not_part_of_its_first_class_id(tmp_path: Path):
    image = tmp_path / "images" / "a.jpg"
    image.parent.mkdir()
    label = label_path_for(image)
    label.parent.mkdir()
    label.write_bytes("0 0.5 0.5 0.5 0.5\r\n1 0.3 0.3 0.2 0.2\r\n".encode("utf-8-sig"))  # as Notepad saves it
    labels, problems = read_yolo_labels(image, num_classes=2)
    assert labels[:, 0].tolist() == [0, 1] and not problems.entries


def test_a_rounding_overshoot_is_clipped_without_a_word():
    """coco128's 000000000071.txt: 0.982555 + 0.0348906 / 2 = 1.0000003, six decimals' rounding: clipped, not
    reported; 0.0015 past the border (a pixel at 640) is reported as before."""
    labels, problems = parse_yolo_label_text("0 0.982555 0.5 0.0348906 0.1\n", num_classes=1, source="x.txt")
    assert not problems.entries and (labels[:, 1] + labels[:, 3] / 2).max() <= 1 + 1e-6
    _, problems = parse_yolo_label_text("0 0.9835 0.5 0.036 0.1\n", num_classes=1, source="x.txt")
    assert {kind for kind, _, _ in problems.entries} == {CLIPPED}


def test_a_coco_box_far_outside_is_named_so_not_slightly_outside():
    """A COCO box is clipped to its image whatever its overshoot (pycocotools scores the JSON's own box); past the
    YOLO labels' tolerance it is counted as reaching far outside, and one wholly outside is dropped as zero-area.
    Before, all three were "slightly outside"."""
    from detector.data.labels import _normalise_coco_boxes
    from detector.data.problems import CLIPPED_FAR, Problems

    problems = Problems()
    rows = np.array([[0, 98.5, 10, 2, 10], [0, 50, 10, 100, 10], [0, 300, 10, 20, 10]], np.float64)  # 100 x 100 px
    labels = _normalise_coco_boxes(rows, 100.0, 100.0, "a.jpg", problems)
    assert {kind: count for kind, _, count in problems.entries} == {CLIPPED: 1, CLIPPED_FAR: 2, ZERO_AREA: 1}
    np.testing.assert_allclose(labels[:, 1:], [[0.9925, 0.15, 0.015, 0.1], [0.75, 0.15, 0.5, 0.1]], atol=1e-6)


def test_download_entry_is_never_run(tmp_path: Path):
    marker = tmp_path / "ran"
    yaml = tmp_path / "dl.yaml"
    yaml.write_text(f"path: missing\ntrain: a\nval: b\nnames: [x]\ndownload: |\n  open('{marker}', 'w').write('x')\n")
    with pytest.raises(DatasetError, match="never executed: fetch the data by hand"):
        load_dataset_spec(yaml)
    assert not marker.exists()


def _list_dataset(root: Path, lines: list[str]) -> Path:
    """A data YAML whose train split is ``root/lists/train.txt`` holding ``lines``."""
    (root / "lists").mkdir()
    (root / "lists/train.txt").write_text("".join(f"{line}\n" for line in lines))
    yaml = root / "list.yaml"
    yaml.write_text("path: .\ntrain: lists/train.txt\nval: images/val\nnames: [a, b, c]\n")
    return yaml


def test_a_list_file_may_name_images_inside_the_root_relatively_or_anywhere_absolutely(yolo_yaml: Path):
    root = yolo_yaml.parent
    first, second = sorted((root / "images/train").iterdir())[:2]
    yaml = _list_dataset(root, ["../images/train/" + first.name, str(second), "", "  ./../images/train/" + first.name])
    images = load_dataset_spec(yaml).train.images
    assert images == [first, second, first]


@pytest.mark.parametrize("line", ["../../outside.png", "../images/../../outside.png", "..\\..\\outside.png"])
def test_a_list_file_line_climbing_out_of_the_dataset_is_refused_naming_the_line(yolo_yaml: Path, line: str):
    root = yolo_yaml.parent
    (root.parent / "outside.png").write_bytes((root / "images/train/train_00000.png").read_bytes())
    first = sorted((root / "images/train").iterdir())[0]
    yaml = _list_dataset(root, ["../images/train/" + first.name, line])
    with pytest.raises(DatasetError) as error:
        load_dataset_spec(yaml)
    message = str(error.value)
    assert message.startswith(f"{root / 'lists/train.txt'}:2: image path {line!r}") and "\n" not in message


def test_a_list_file_of_non_utf8_names_reads_them_as_the_file_system_does(yolo_yaml: Path):
    root = yolo_yaml.parent
    name = os.fsdecode(b"caf\xe9.png")  # Latin-1 bytes: not UTF-8
    (root / "images/train" / name).write_bytes((root / "images/train/train_00000.png").read_bytes())
    (root / "lists").mkdir()
    (root / "lists/train.txt").write_bytes(b"../images/train/caf\xe9.png\n")
    yaml = root / "list.yaml"
    yaml.write_text("path: .\ntrain: lists/train.txt\nval: images/val\nnames: [a, b, c]\n")
    assert [p.name for p in load_dataset_spec(yaml).train.images] == [name]


def test_a_coco_yaml_without_names_takes_the_jsons_categories_in_id_order(tmp_path: Path):
    """The JSON lists its categories (ids 7, 9, 11 here, out of order in the file): a YAML need not repeat them.
    The names follow the ids' order, the order the label reader maps ids to classes in."""
    import json

    yaml_path = write_coco_dataset(tmp_path)
    json_path = tmp_path / "instances.json"
    coco = json.loads(json_path.read_text())
    coco["categories"].reverse()
    json_path.write_text(json.dumps(coco))
    yaml_path.write_text(yaml_path.read_text().replace(f"names: {NAMES}\n", ""))
    spec = load_dataset_spec(yaml_path)
    assert spec.names == list(NAMES)
    records = build_split(spec, "train", image_size=64, augment=None, cache="none").records
    assert sum(len(record.labels) for record in records) > 0  # the same names the labels were read with
    coco["categories"] = [{"id": 7}]
    json_path.write_text(json.dumps(coco))
    with pytest.raises(DatasetError, match=r"instances.json: its 'categories' give no id and name each .* in coco.yaml"):
        load_dataset_spec(yaml_path)


def test_a_yaml_that_is_not_utf8_is_one_line_naming_the_file(tmp_path: Path, yolo_yaml: Path):
    yaml = yolo_yaml.parent / "latin1.yaml"
    yaml.write_bytes("path: .\ntrain: images/train\nval: images/val\nnames: [café, b, c]\n".encode("latin-1"))
    with pytest.raises(DatasetError) as error:
        load_dataset_spec(yaml)
    assert str(error.value).startswith(f"{yaml}: not UTF-8 text (byte 0xe9 at offset ") and "\n" not in str(error.value)


def test_a_roboflow_export_s_parent_paths_are_read_inside_its_folder(yolo_yaml: Path):
    """Roboflow writes 'train: ../train/images' in a data.yaml that sits in the dataset's folder; where no such folder
    is above it, the path is read inside the dataset folder, as Ultralytics does."""
    root = yolo_yaml.parent
    (root / "export").mkdir()
    for split in ("train", "val"):
        (root / "export" / split).mkdir()
        (root / "images" / split).rename(root / "export" / split / "images")
        (root / "labels" / split).rename(root / "export" / split / "labels")
    yaml = root / "export" / "data.yaml"
    yaml.write_text(f"train: ../train/images\nval: ../val/images\nnames: {NAMES}\n")
    spec = load_dataset_spec(yaml)
    assert len(spec.train.images) == 8 and spec.train.images[0].parent == root / "export" / "train" / "images"
    assert len(build_split(spec, "val", image_size=64, augment=None, cache="none").records.box_counts()) == 4
    (root / "export" / "val" / "images").rename(root / "export" / "val" / "pictures")  # neither place: one line
    with pytest.raises(DatasetError, match="'val' path does not exist"):
        load_dataset_spec(yaml)


def test_image_suffixes_pillow_reads_are_listed_and_those_it_does_not_are_named(yolo_yaml: Path, capsys):
    images = yolo_yaml.parent / "images" / "train"
    jpeg = cv2.imencode(".jpg", np.full((64, 64, 3), 90, np.uint8))[1].tobytes()
    for name in ("a.jfif", "b.JPE", "c.mpo"):
        (images / name).write_bytes(jpeg)
    (images / "d.HEIC").write_bytes(b"\0\0\0\x18ftypheic")
    (images / "e.heif").write_bytes(b"\0\0\0\x18ftypheic")
    spec = load_dataset_spec(yolo_yaml)
    assert {p.name for p in spec.train.images} >= {"a.jfif", "b.JPE", "c.mpo"} and len(spec.train.images) == 11
    warning = capsys.readouterr().err.strip()
    assert warning.startswith("warning: data.yaml 'train': 2 .heic/.heif image(s) in ") and "\n" not in warning


def test_a_missing_test_split_stops_only_what_asks_for_it(yolo_yaml: Path):
    """Roboflow's data.yaml names '../test/images' whether or not the export has one; training stopped on it, where
    Ultralytics trains. Only a request for the 'test' split is refused, with the reason."""
    root = yolo_yaml.parent
    yaml = root / "data.yaml"
    yaml.write_text(f"path: .\ntrain: images/train\nval: images/val\ntest: images/test\nnames: {NAMES}\n")
    spec = load_dataset_spec(yaml)
    assert spec.test is None and len(spec.train.images) == 8
    with pytest.raises(DatasetError, match=r"'test' path does not exist: .*images/test"):
        build_split(spec, "test", image_size=64, augment=None, cache="none")


def test_a_validation_key_is_read_as_val(yolo_yaml: Path, capsys):
    yaml = yolo_yaml.parent / "data.yaml"
    yaml.write_text(f"train: images/train\nvalidation: images/val\nnames: {NAMES}\n")
    assert len(load_dataset_spec(yaml).val.images) == 4
    assert "'validation' read as 'val'" in capsys.readouterr().err


def test_an_ultralytics_relative_path_is_found_under_the_datasets_root(yolo_yaml: Path, tmp_path: Path, capsys):
    """Ultralytics' own YAMLs say 'path: coco128' and mean its datasets folder: read beside the YAML first, then
    under our datasets root, with a note."""
    datasets = tmp_path / "datasets"
    datasets.mkdir()
    yolo_yaml.parent.rename(datasets / "mine")
    yaml = tmp_path / "configs" / "mine.yaml"
    yaml.parent.mkdir()
    yaml.write_text(f"path: mine\ntrain: images/train\nval: images/val\nnames: {NAMES}\n")
    spec = load_dataset_spec(yaml, datasets_dir=datasets)
    assert len(spec.train.images) == 8 and spec.train.images[0].is_relative_to(datasets / "mine")
    assert "not beside the YAML; using" in capsys.readouterr().err
    with pytest.raises(DatasetError, match="'path' folder does not exist"):
        load_dataset_spec(yaml, datasets_dir=tmp_path / "elsewhere")


def test_a_relative_path_found_only_from_the_working_folder_says_so(yolo_yaml: Path, tmp_path: Path, monkeypatch):
    """Ultralytics also tries a relative 'path' from the folder it runs in; the error says where to write it."""
    (tmp_path / "cfg").mkdir()
    yaml = tmp_path / "cfg" / "data.yaml"
    yaml.write_text(f"path: {yolo_yaml.parent.name}\ntrain: images/train\nval: images/val\nnames: {NAMES}\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DatasetError) as error:
        load_dataset_spec(yaml, datasets_dir=tmp_path / "elsewhere")
    assert str(error.value).endswith(f"not from the folder the command runs in; {yolo_yaml.parent} is there: "
                                     "write it as an absolute path)")


def test_a_linked_image_in_a_list_keeps_the_label_beside_its_listed_path(yolo_yaml: Path):
    """A relative line naming a link is folded, not resolved: its label is looked for under labels/, as
    Ultralytics looks for it, not beside the link's target (the image trained as background, silently)."""
    root = yolo_yaml.parent
    first = sorted((root / "images/train").iterdir())[0]
    (root / "pool").mkdir()
    target = root / "pool" / "elsewhere.png"
    first.rename(target)
    first.symlink_to(target)
    yaml = _list_dataset(root, ["../images/train/" + first.name, "./../images/train/" + first.name])
    split = build_split(load_dataset_spec(yaml), "train", image_size=64, augment=None, cache="none")
    assert split.records.path(0) == first and len(split.records.labels_of(0)) > 0


def test_a_folder_split_follows_linked_folders_once_and_leaves_hidden_names_out(yolo_yaml: Path):
    """As Ultralytics' glob: linked folders are read (a link back to the split's own folder is not), dot-names
    are not."""
    root = yolo_yaml.parent
    train = root / "images/train"
    before = load_dataset_spec(yolo_yaml).train.images
    (root / "more").mkdir()
    extra = root / "more" / "linked.png"
    extra.write_bytes(before[0].read_bytes())
    (train / "linked").symlink_to(root / "more", target_is_directory=True)
    (train / "loop").symlink_to(train, target_is_directory=True)
    (train / "._photo.png").write_bytes(b"\x00\x05\x16\x07")  # macOS metadata, not an image
    (train / ".cache").mkdir()
    (train / ".cache" / "copy.png").write_bytes(before[0].read_bytes())
    images = load_dataset_spec(yolo_yaml).train.images
    assert sorted(images) == sorted([*before, train / "linked" / "linked.png"])


def test_image_names_that_are_not_files_are_named_in_one_line(yolo_yaml: Path, capsys):
    """A link whose target is gone was left out without a word; other names that are not images still are."""
    train = yolo_yaml.parent / "images/train"
    before = load_dataset_spec(yolo_yaml).train.images
    capsys.readouterr()
    (train / "gone.jpg").symlink_to(yolo_yaml.parent / "nowhere.jpg")
    (train / "gone.txt").symlink_to(yolo_yaml.parent / "nowhere.txt")
    assert load_dataset_spec(yolo_yaml).train.images == before
    lines = [line for line in capsys.readouterr().err.splitlines() if "not files" in line]
    assert lines == [f"warning: {yolo_yaml.name} 'train': 1 image name(s) in {train} that are not files (a link whose "
                     f"target is gone?) left out: {train / 'gone.jpg'}"]


def test_a_split_naming_another_kind_of_file_says_what_it_may_be(yolo_yaml: Path):
    root = yolo_yaml.parent
    (root / "train.json").write_text("{}")
    first = sorted((root / "images/train").iterdir())[0]
    (root / "list.TXT").write_text(f"{first}\n")
    yaml = root / "kinds.yaml"
    yaml.write_text("path: .\ntrain: list.TXT\nval: train.json\nnames: [a, b, c]\n")
    with pytest.raises(DatasetError, match=r"'val' is neither a folder of images, an image nor a \.txt list"):
        load_dataset_spec(yaml)
    yaml.write_text("path: .\ntrain: list.TXT\nval: images/val\nnames: [a, b, c]\n")
    assert load_dataset_spec(yaml).train.images == [first]


def test_a_channel_count_other_than_three_is_named_as_read_as_three(yolo_yaml: Path, capsys):
    yolo_yaml.write_text(yolo_yaml.read_text() + "channels: 1\n")
    load_dataset_spec(yolo_yaml)
    assert "'channels: 1' is read as 3" in capsys.readouterr().err
