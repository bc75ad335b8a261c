from pathlib import Path

import numpy as np
import pytest

from detector.data.build import build_split
from detector.data.labels import label_path_for, parse_yolo_label_text
from detector.data.problems import CLASS_OUT_OF_RANGE, CLIPPED, DUPLICATE, FAR_OUTSIDE, WRONG_COLUMNS, ZERO_AREA
from detector.data.spec import DatasetError, load_dataset_spec


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


@pytest.mark.parametrize(
    "body, field",
    [
        ("path: .\ntrain: images/train\nval: images/val\n", "names"),
        ("path: .\nval: images/val\nnames: [a]\n", "train"),
        ("path: .\ntrain: nowhere\nval: images/val\nnames: [a]\n", "train"),
        ("path: .\ntrain: images/train\nval: images/val\nnc: 2\nnames: [a]\n", "nc"),
        ("path: missing_root\ntrain: images/train\nval: images/val\nnames: [a]\n", "path"),
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


def test_download_entry_is_never_run(tmp_path: Path):
    marker = tmp_path / "ran"
    yaml = tmp_path / "dl.yaml"
    yaml.write_text(f"path: missing\ntrain: a\nval: b\nnames: [x]\ndownload: |\n  open('{marker}', 'w').write('x')\n")
    with pytest.raises(DatasetError, match="never executed: fetch the data by hand"):
        load_dataset_spec(yaml)
    assert not marker.exists()
