"""Pascal VOC XML -> YOLO txt (detector/data/voc.py) and the shipped VOC.yaml.

The download end to end (served zips, the CLI, a corrupt zip) is in test_download.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from detector.data.catalog import PACKAGE_DIR, resolve_data_yaml
from detector.data.spec import DatasetError, load_dataset_spec
from detector.data.voc import MALFORMED, NOT_A_CLASS, VOC_NAMES, UnsafeImageId, convert_voc, yolo_rows
from tests.conftest import voc_xml, write_voc_devkit

REPO = PACKAGE_DIR.parent


def test_voc_yaml_lists_the_20_classes_in_the_standard_order_and_the_07_12_split():
    raw = yaml.safe_load((REPO / "data/VOC.yaml").read_text())
    assert tuple(raw["names"]) == VOC_NAMES and len(VOC_NAMES) == 20
    assert VOC_NAMES[0] == "aeroplane" and VOC_NAMES[14] == "person" and VOC_NAMES[-1] == "tvmonitor"
    assert raw["relative_to"] == "datasets" and raw["path"] == "VOC"
    assert raw["train"] == ["images/trainval2007", "images/trainval2012"] and raw["val"] == "images/test2007"
    assert "download" not in raw  # fetching is explicit, never from a YAML


@pytest.mark.parametrize("name", ["voc", "VOC", "VOC.yaml", "voc.yaml"])
def test_voc_resolves_by_any_case(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_data_yaml(name) == REPO / "data/VOC.yaml"


def test_a_missing_voc_names_its_download_command(tmp_path: Path):
    with pytest.raises(DatasetError) as error:
        load_dataset_spec("voc", datasets_dir=tmp_path)
    message = str(error.value)
    assert "\n" not in message and str(tmp_path / "VOC") in message
    assert f"(about 2.8 GB): python -m detector download voc --datasets-dir {tmp_path}" in message


def test_boxes_are_normalised_from_1_based_pixels_and_difficult_objects_are_skipped(tmp_path: Path):
    xml = tmp_path / "a.xml"
    xml.write_text(voc_xml([("dog", 1, 1, 32, 24, 0), ("person", 5, 5, 20, 20, 1), ("car", 11, 5, 40, 44, 0),
                            ("unicorn", 1, 1, 2, 2, 0)]))
    rows, skipped = yolo_rows(xml, VOC_NAMES)
    # dog: pixels 1..32 x 1..24 of 64x48 -> [0, 32] x [0, 24]; car: [10, 40] x [4, 44]
    assert rows == ["11 0.250000 0.250000 0.500000 0.500000", "6 0.390625 0.500000 0.468750 0.833333"]
    assert skipped.entries == [(NOT_A_CLASS, f"{xml} (object 'unicorn')", 1)]
    assert skipped.lines() == [f"1 {NOT_A_CLASS}, in 1 file(s): {xml} (object 'unicorn')"]


def test_convert_writes_each_image_set_once_and_removes_the_devkit(tmp_path: Path, capsys: pytest.CaptureFixture):
    folder = tmp_path / "VOC"
    write_voc_devkit(folder, "2007", "trainval", {
        "000001": voc_xml([("cat", 1, 1, 64, 48, 0)]),
        "000002": voc_xml([("cat", 1, 1, 64, 48, 1)]),  # only a difficult object: an empty label file
    })
    (folder / "labels/.trainval2007.converting").mkdir(parents=True)  # left by an interrupted run
    (folder / "labels/.trainval2007.converting/stale.txt").write_text("0 0.5 0.5 1 1\n")
    convert_voc(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["images", "labels"]
    assert sorted(p.name for p in (folder / "images").iterdir()) == ["trainval2007"]
    assert sorted(p.name for p in (folder / "images/trainval2007").iterdir()) == ["000001.jpg", "000002.jpg"]
    assert sorted(p.name for p in (folder / "labels").iterdir()) == ["trainval2007"]
    assert (folder / "labels/trainval2007/000001.txt").read_text() == "7 0.500000 0.500000 1.000000 1.000000\n"
    assert (folder / "labels/trainval2007/000002.txt").read_text() == ""
    assert capsys.readouterr().err == ""
    # a devkit holding an already converted set again (a second zip with the same set) changes nothing
    write_voc_devkit(folder, "2007", "trainval", {"000009": voc_xml([("dog", 1, 1, 64, 48, 0)])})
    convert_voc(folder)
    assert sorted(p.name for p in (folder / "images/trainval2007").iterdir()) == ["000001.jpg", "000002.jpg"]
    assert not (folder / "VOCdevkit").exists()


def test_malformed_xml_skips_its_image_with_one_summary_line_naming_the_files(tmp_path: Path,
                                                                             capsys: pytest.CaptureFixture):
    folder = tmp_path / "VOC"
    devkit = write_voc_devkit(folder, "2012", "trainval", {
        "2012_000001": voc_xml([("bus", 1, 1, 64, 48, 0)]),
        "2012_000002": "<annotation><size><width>64</width>",  # cut off
        "2012_000003": voc_xml([("bus", 1, 1, 64, 48, 0)], width=0),
        "2012_000004": voc_xml([("bus", 1, 1, 64, 48, 0)], width="nan"),  # float() reads it; a NaN box follows
        "2012_000005": voc_xml([("bus", 1, 1, "inf", 48, 0)]),
    })
    convert_voc(folder)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"warning: VOC trainval2012: 4 {MALFORMED}, in 4 file(s): ")
    assert str(devkit / "Annotations/2012_000002.xml") in lines[0]
    assert f"{devkit / 'Annotations/2012_000003.xml'} (image size 0x48)" in lines[0]
    assert "<width> is 'nan', not a finite number" in lines[0] and lines[0].endswith("(1 more)")
    assert [p.name for p in (folder / "images/trainval2012").iterdir()] == ["2012_000001.jpg"]


@pytest.mark.parametrize("image_id", ["../../../escaped", "/tmp/absolute", "sub/dir", "sub\\dir", "..", "C:x"])
def test_an_image_id_that_is_not_a_plain_name_refuses_the_devkit_before_writing(tmp_path: Path, image_id: str):
    folder = tmp_path / "data" / "VOC"
    devkit = write_voc_devkit(folder, "2007", "trainval", {"000001": voc_xml([("cat", 1, 1, 64, 48, 0)])})
    write_voc_devkit(folder, "2012", "trainval", {"2012_000001": voc_xml([("cat", 1, 1, 64, 48, 0)])})
    listing = devkit / "ImageSets/Main/trainval.txt"
    listing.write_text(f"000001\n{image_id}\n")
    # The files an escaping id reaches, so that a conversion that followed it would write a label outside.
    (folder / "escaped.jpg").write_bytes((devkit / "JPEGImages/000001.jpg").read_bytes())
    (folder / "escaped.xml").write_text(voc_xml([("dog", 1, 1, 64, 48, 0)]))
    before = sorted(p for p in tmp_path.rglob("*"))
    with pytest.raises(UnsafeImageId) as error:
        convert_voc(folder)
    message = str(error.value)
    assert message.startswith(f"{listing}:2: image id {image_id!r}") and "\n" not in message
    assert sorted(p for p in tmp_path.rglob("*")) == before  # nothing written, not even the 2012 set
