"""Shipped data YAMLs, ``--data NAME`` resolution, the datasets root, and the missing-dataset line."""

from __future__ import annotations

import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml

from detector.cli import download as download_command
from detector.cli import train as train_command
from detector.data.catalog import (
    DATASETS_ENV,
    DOWNLOADS,
    PACKAGE_DIR,
    SMALL_DATASETS,
    datasets_root,
    fetching_command,
    resolve_data_yaml,
    shipped_yaml_dir,
)
from detector.data import spec as spec_module
from detector.data.spec import DatasetError, load_dataset_spec, load_split
from detector.data.synthetic import write_shapes
from detector.paths import HOME_ENV
from tests.conftest import write_coco_dataset, write_yolo_dataset

REPO = PACKAGE_DIR.parent


def test_shipped_yamls_are_the_top_level_data_folder():
    assert shipped_yaml_dir() == REPO / "data"
    assert {p.name for p in (REPO / "data").glob("*.yaml")} >= {"coco.yaml", "coco128.yaml", "VOC.yaml", "shapes.yaml"}


def test_coco_yamls_list_the_80_classes_in_category_order():
    coco = yaml.safe_load((REPO / "data/coco.yaml").read_text())
    coco128 = yaml.safe_load((REPO / "data/coco128.yaml").read_text())
    assert len(coco["names"]) == 80 and len(set(coco["names"])) == 80
    assert coco["names"] == coco128["names"]
    assert coco["names"][:3] == ["person", "bicycle", "car"] and coco["names"][-1] == "toothbrush"
    assert coco["train"] == {"json": "annotations/instances_train2017.json", "images": "train2017"}
    assert coco["relative_to"] == coco128["relative_to"] == "datasets"
    assert "download" not in coco and "download" not in coco128  # fetching is explicit, never from a YAML


def test_shipped_shapes_yaml_generates_the_set_into_the_datasets_root(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch):
    calls = []

    def small_set(folder: Path) -> Path:  # the real generator, at 2 + 2 images of 64 px (the full set takes ~6 s)
        calls.append(folder)
        return write_shapes(folder, train=2, val=2, size=64)

    monkeypatch.setattr(spec_module, "write_shapes", small_set)
    monkeypatch.setenv(DATASETS_ENV, str(tmp_path / "root"))
    spec = load_dataset_spec("shapes")
    assert calls == [tmp_path / "root" / "shapes"]
    assert spec.names == ["circle", "square", "triangle"] and len(spec.train.images) == 2
    assert all(Path(image).is_relative_to(tmp_path / "root" / "shapes") for image in spec.train.images)


def test_a_datasets_root_that_cannot_be_written_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "file").write_text("")  # a file where the root's folder would go: no user can create it
    monkeypatch.setenv(DATASETS_ENV, str(tmp_path / "file" / "root"))
    with pytest.raises(DatasetError, match=r"shapes.yaml: cannot generate the built-in set into .*--datasets-dir"):
        load_dataset_spec("shapes")


def test_generate_names_only_the_builtin_set(tmp_path: Path):
    (tmp_path / "odd.yaml").write_text("path: .\ngenerate: coco\ntrain: a\nval: a\nnames: [x]\n")
    with pytest.raises(DatasetError, match=r"odd.yaml: 'generate' can only be 'shapes'"):
        load_dataset_spec(tmp_path / "odd.yaml")


def test_names_resolve_as_a_path_first_then_as_a_shipped_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_data_yaml("coco") == resolve_data_yaml("coco.yaml") == REPO / "data/coco.yaml"
    (tmp_path / "coco.yaml").write_text("path: .\n")
    assert resolve_data_yaml("coco.yaml") == Path("coco.yaml")  # the user's own file wins
    assert resolve_data_yaml("nothing.yaml") == Path("nothing.yaml")


def test_datasets_root_flag_then_environment_then_data_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path / "..")  # the working directory plays no part
    monkeypatch.delenv(DATASETS_ENV, raising=False)
    monkeypatch.delenv(HOME_ENV, raising=False)
    assert datasets_root() == REPO / "datasets"  # a source checkout keeps its own
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    assert datasets_root() == tmp_path / "home" / "datasets"
    monkeypatch.setenv(DATASETS_ENV, str(tmp_path / "env"))
    assert datasets_root() == tmp_path / "env"
    assert datasets_root(tmp_path / "flag") == tmp_path / "flag"


def test_shipped_coco128_loads_from_the_datasets_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    write_yolo_dataset(tmp_path / "coco128")
    (tmp_path / "coco128/images/train").rename(tmp_path / "coco128/images/train2017")
    monkeypatch.setenv(DATASETS_ENV, str(tmp_path))
    spec = load_dataset_spec("coco128")
    assert spec.num_classes == 80 and len(spec.train.images) == 8 and spec.val.images == spec.train.images


def test_coco_val_split_alone_loads_and_training_names_the_missing_archive(tmp_path: Path):
    write_coco_dataset(tmp_path / "coco")
    (tmp_path / "coco/annotations").mkdir()
    shutil.move(tmp_path / "coco/instances.json", tmp_path / "coco/annotations/instances_val2017.json")
    # What download coco --split val leaves: the annotations zip holds the train JSON too
    annotations = tmp_path / "coco/annotations"
    shutil.copy(annotations / "instances_val2017.json", annotations / "instances_train2017.json")
    (tmp_path / "coco/images").rename(tmp_path / "coco/val2017")
    split = load_split("coco.yaml", "val", datasets_dir=tmp_path)
    assert split.coco_json == tmp_path / "coco/annotations/instances_val2017.json"
    with pytest.raises(DatasetError) as error:
        load_dataset_spec("coco.yaml", datasets_dir=tmp_path)
    train_size = DOWNLOADS["coco"].archives[-1].size
    assert "'train.images'" in str(error.value) and f"({train_size / 1e9:.1f} GB)" in str(error.value)
    # COCO's zips are served over plain http (checked by size and MD5): the command says --allow-http, or it is refused
    assert f"python -m detector download coco --datasets-dir {tmp_path} --allow-http" in str(error.value)


def test_an_incomplete_dataset_folder_is_named_with_what_it_lacks(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                  monkeypatch: pytest.MonkeyPatch):
    """mkdir -p X/coco128: training said to download, and download fetched nothing and said the same, for ever."""
    monkeypatch.setenv("DETECTOR_DOWNLOAD_URL", "https://127.0.0.1:9")  # were anything fetched: no network
    root = tmp_path / "datasets"
    (root / "coco128/images").mkdir(parents=True)
    with pytest.raises(DatasetError) as error:
        load_dataset_spec("coco128.yaml", datasets_dir=root)
    expected = f"{root / 'coco128'} exists but is incomplete (no images/train2017): move it away, then fetch it"
    assert expected in str(error.value) and "\n" not in str(error.value)
    assert download_command.main(["coco128", "--datasets-dir", str(root)]) == 1  # refused before any fetch
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0] == (f"error: {root / 'coco128'}: exists but is incomplete "
                                            "(no images/train2017): move it away and run the command again"), lines
    assert DOWNLOADS["coco128"].missing(root) and (root / "coco128/images").is_dir()
    (root / "coco128/images/train2017").mkdir()
    (root / "coco128/labels/train2017").mkdir(parents=True)  # empty folders: still not the dataset
    assert DOWNLOADS["coco128"].incomplete(root) == (root / "coco128", "no images/train2017")


def test_train_on_a_missing_dataset_prints_one_line_and_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture):
    empty = tmp_path / "datasets"
    empty.mkdir()
    code = train_command.main(["--data", "coco.yaml", "--datasets-dir", str(empty), "--device", "cpu", "--epochs", "1"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1, lines
    assert str(empty / "coco") in lines[0] and "20.4 GB" in lines[0]
    assert f"python -m detector download coco --datasets-dir {empty} --allow-http" in lines[0]


def test_yaml_relative_paths_still_resolve_against_the_yaml_folder(yolo_yaml: Path, tmp_path: Path):
    assert len(load_dataset_spec(yolo_yaml, datasets_dir=tmp_path / "elsewhere").train.images) == 8
    yolo_yaml.write_text(yolo_yaml.read_text() + "relative_to: somewhere\n")
    with pytest.raises(DatasetError, match="'relative_to'"):
        load_dataset_spec(yolo_yaml)


def test_pyproject_lists_every_subpackage_and_ships_the_yamls():
    """packages is an explicit list (to map data/ -> detector.datasets): a new subpackage must be added."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "detector").rglob("__init__.py")}
    assert found | {"detector.datasets"} == set(setuptools["packages"])
    assert setuptools["package-dir"] == {"detector.datasets": "data"}
    assert setuptools["package-data"]["detector.datasets"] == ["*.yaml"]


def test_ultralytics_quick_start_names_point_at_the_shipped_neighbour():
    """``coco8-grayscale`` is not shipped: the line names coco8, which is."""
    with pytest.raises(DatasetError, match=r"coco8-grayscale\.yaml: data YAML not found .*; did you mean coco8\?$"):
        load_dataset_spec("coco8-grayscale.yaml")
    with pytest.raises(DatasetError, match=r"not found \(nor a shipped one in .*\)$"):
        load_dataset_spec("objects365.yaml")


def test_a_url_or_an_archive_as_data_is_one_line_naming_what_to_do(tmp_path: Path, capsys: pytest.CaptureFixture):
    """A URL lost a slash to Path ("https:/github.com/...: data YAML not found"); a zip was "not UTF-8 text"."""
    url = "https://github.com/ultralytics/assets/releases/download/v0.0.0/coco128.zip"
    code = train_command.main(["--data", url, "--device", "cpu", "--epochs", "1"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1, lines
    assert lines[0] == (f"error: {url}: a URL; data is read from local files only, nothing is downloaded: fetch the "
                        "dataset with python -m detector download coco128, then pass --data coco128.yaml")
    zipped = tmp_path / "mine.zip"
    zipped.write_bytes(b"PK\x03\x04" + bytes(range(256)))
    with pytest.raises(DatasetError) as error:
        load_dataset_spec(zipped)
    assert str(error.value) == f"{zipped}: an archive; data is not read from inside one: unzip it and pass the " \
                               "data YAML it holds"
    with pytest.raises(DatasetError, match=r"^http://images.cocodataset.org/zips/val2017.zip: a URL; .* python -m "
                                           r"detector download coco --allow-http, then pass --data coco.yaml$"):
        load_split("http://images.cocodataset.org/zips/val2017.zip", "val")
    with pytest.raises(DatasetError, match=r"^https://example.org/d.yaml: a URL; .*: download it and pass the file$"):
        load_dataset_spec("https://example.org/d.yaml")
    with pytest.raises(DatasetError, match="data YAML not found"):  # a Windows drive is no URL scheme
        load_dataset_spec("C:/data/my.yaml")


def test_suggested_commands_quote_a_datasets_root_with_spaces(tmp_path: Path):
    root = tmp_path / "my data"
    root.mkdir()
    with pytest.raises(DatasetError) as error:
        load_dataset_spec("coco128.yaml", datasets_dir=root)
    assert str(error.value).endswith(f"python -m detector download coco128 --datasets-dir '{root}'")


@pytest.mark.parametrize("typed,name", [("coco.yaml", "coco"), ("coco128.yaml", "coco128"), ("VOC.yaml", "voc"),
                                        ("VOC", "voc"), ("yolov8n.pt", "yolov8n"), ("COCO8", "coco8"),
                                        ("coco8.yaml", "coco8"), ("HomeObjects-3K", "homeobjects-3k"),
                                        ("HomeObjects-3K.yaml", "homeobjects-3k"), ("Brain-Tumor", "brain-tumor")])
def test_download_takes_a_dataset_by_its_yaml_name_as_data_does(typed: str, name: str):
    assert download_command.build_parser().parse_args([typed]).name == name


def test_the_missing_dataset_line_names_what_chose_the_datasets_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """It said "set by --datasets-dir or $DETECTOR_DATASETS" when $DETECTOR_HOME had chosen it."""
    monkeypatch.delenv(DATASETS_ENV, raising=False)
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    with pytest.raises(DatasetError, match=rf"\(datasets root {tmp_path / 'home' / 'datasets'}, from \$DETECTOR_HOME; "
                                           r"--datasets-dir or \$DETECTOR_DATASETS choose another\)"):
        load_dataset_spec("coco128.yaml")
    monkeypatch.setenv(DATASETS_ENV, str(tmp_path / "env"))
    with pytest.raises(DatasetError, match=r"\(datasets root .*env, set by \$DETECTOR_DATASETS\)"):
        load_dataset_spec("coco128.yaml")
    with pytest.raises(DatasetError, match=r"\(datasets root .*flag, set by --datasets-dir\)"):
        load_dataset_spec("coco128.yaml", datasets_dir=tmp_path / "flag")


# Ultralytics' small detection sets: YAML -> (class count, {index: name}), from each set's own class list.
SMALL_SET_CLASSES = {
    "coco8.yaml": (80, {0: "person", 79: "toothbrush"}),
    "brain-tumor.yaml": (2, {0: "negative", 1: "positive"}),
    "medical-pills.yaml": (1, {0: "pill"}),
    "signature.yaml": (1, {0: "signature"}),
    "african-wildlife.yaml": (4, {0: "buffalo", 3: "zebra"}),
    "construction-ppe.yaml": (11, {0: "helmet", 6: "Person", 10: "no_boots"}),
    "HomeObjects-3K.yaml": (12, {0: "bed", 11: "photo frame"}),
    "kitti.yaml": (8, {0: "car", 7: "misc"}),
}


def write_split(folder: Path, split: str, count: int) -> None:
    """``count`` tiny images and class-0 labels (every set has a class 0) under ``folder/{images,labels}/split``."""
    (folder / "images" / split).mkdir(parents=True)
    (folder / "labels" / split).mkdir(parents=True)
    for index in range(count):
        cv2.imwrite(str(folder / "images" / split / f"{index}.jpg"), np.full((16, 16, 3), 128, np.uint8))
        (folder / "labels" / split / f"{index}.txt").write_text("0 0.5 0.5 0.25 0.25\n")


def test_every_small_set_is_a_download_with_a_shipped_yaml():
    assert {download.yaml for download in SMALL_DATASETS} == set(SMALL_SET_CLASSES)
    for download in SMALL_DATASETS:
        assert DOWNLOADS[download.name] is download and download.name == download.name.lower()
        raw = yaml.safe_load((REPO / "data" / download.yaml).read_text())
        assert raw["relative_to"] == "datasets" and raw["path"] == download.folder_name and "download" not in raw
        (archive,) = download.archives
        assert archive.url == f"https://github.com/ultralytics/assets/releases/download/v0.0.0/{raw['path']}.zip"
        assert archive.flat and not archive.exact_size and archive.md5 is None and archive.sha256 is None
        assert fetching_command(archive.filename) == (f"python -m detector download {download.name}", download.yaml)


@pytest.mark.parametrize("name", sorted(SMALL_SET_CLASSES))
def test_each_small_set_yaml_loads_and_names_its_classes(name: str, tmp_path: Path):
    raw = yaml.safe_load((REPO / "data" / name).read_text())
    splits = [split for split in ("train", "val", "test") if split in raw]
    for count, split in enumerate(splits, start=1):
        write_split(tmp_path / raw["path"], split, count)
    spec = load_dataset_spec(name, datasets_dir=tmp_path)
    classes, known = SMALL_SET_CLASSES[name]
    assert spec.num_classes == classes == len(set(spec.names))
    assert {index: spec.names[index] for index in known} == known
    assert len(spec.train.images) == 1 and len(spec.val.images) == 2
    # Ultralytics' african-wildlife and construction-ppe have a test split; ours reads it (val --split test)
    assert (spec.test is not None and len(spec.test.images) == 3) == (name in ("african-wildlife.yaml",
                                                                             "construction-ppe.yaml"))


@pytest.mark.parametrize("typed,shipped", [("coco8", "coco8.yaml"), ("COCO8.yaml", "coco8.yaml"),
                                           ("homeobjects-3k", "HomeObjects-3K.yaml"),
                                           ("HOMEOBJECTS-3K.YAML", "HomeObjects-3K.yaml"), ("Kitti", "kitti.yaml"),
                                           ("Brain-Tumor.yaml", "brain-tumor.yaml")])
def test_a_small_set_is_found_by_its_bare_name_in_any_case(typed: str, shipped: str, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)  # no file of that name here: the shipped YAML is meant
    assert resolve_data_yaml(typed) == REPO / "data" / shipped


def test_train_on_missing_coco8_names_its_download_command(tmp_path: Path, capsys: pytest.CaptureFixture):
    """``python train.py --data coco8.yaml`` said "data YAML not found ... did you mean coco128?"."""
    empty = tmp_path / "datasets"
    empty.mkdir()
    code = train_command.main(["--data", "coco8.yaml", "--datasets-dir", str(empty), "--device", "cpu",
                               "--epochs", "1"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1, lines
    assert str(empty / "coco8") in lines[0]
    assert lines[0].endswith(f"fetch it (about 1 MB): python -m detector download coco8 --datasets-dir {empty}")
