"""What predict writes (detector/workflows/outputs.py): records, YOLO labels, annotated images, crops, and names
that never overwrite one another."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from detector.inference.sources import Frame
from detector.workflows.options import PredictOptions
from detector.workflows.outputs import output_stem, to_record, yolo_lines


def test_to_record_rounds_for_json() -> None:
    result = {"file": "a.jpg", "frame": None, "boxes": np.array([[1.234, 2.0, 3.456, 4.0]], dtype=np.float32),
              "scores": np.array([0.123456], dtype=np.float32), "labels": np.array([2]), "names": ["cat"]}
    assert to_record(result) == {"file": "a.jpg", "frame": None, "boxes": [[1.23, 2.0, 3.46, 4.0]],
                                 "scores": [0.1235], "labels": [2], "names": ["cat"]}


def test_yolo_lines_are_normalised_centre_and_size() -> None:
    result = {"boxes": np.array([[10, 20, 30, 60], [0, 0, 100, 50]], dtype=np.float32),
              "scores": np.array([0.9, 0.25], dtype=np.float32), "labels": np.array([2, 0])}
    # image 100 wide, 50 high: (10+30)/2/100 = 0.2, (20+60)/2/50 = 0.8, 20/100 = 0.2, 40/50 = 0.8
    assert yolo_lines(result, 50, 100, with_score=False) == "2 0.2 0.8 0.2 0.8\n0 0.5 0.5 1 1\n"
    assert yolo_lines(result, 50, 100, with_score=True).splitlines()[1] == "0 0.5 0.5 1 1 0.25"
    assert yolo_lines({**result, "boxes": result["boxes"][:0], "scores": result["scores"][:0],
                       "labels": result["labels"][:0]}, 50, 100, with_score=False) == ""


def test_outputs_are_named_after_the_source() -> None:
    assert output_stem("a/x.jpg") == Path("a/x") and output_stem("webcam0") == Path("webcam0")
    assert output_stem("rtsp://cam.local:554/live/1") == Path("cam.local_554_live_1")


def test_video_frame_labels_are_numbered_from_1_as_ultralytics_does(tmp_path: Path) -> None:
    """``--save-txt`` on a video: ``clip_1.txt`` for its first frame (Ultralytics' name; ``clip_0.txt`` before);
    predictions.json keeps the frame index, from 0; a still image's file has no number."""
    from detector.workflows.outputs import Outputs

    outputs = Outputs(tmp_path, PredictOptions(source="clip.mp4", save_txt=True), ["cat", "dog"])
    image = np.zeros((32, 32, 3), np.uint8)
    for frame in (Frame("clip.mp4", 0, image, 25.0), Frame("clip.mp4", 1, image, 25.0), Frame("a.jpg", None, image)):
        outputs.add(frame, {"file": frame.name, "frame": frame.index, "boxes": np.array([[0, 0, 16, 16]], np.float32),
                            "scores": np.array([0.5], np.float32), "labels": np.array([1]), "names": ["dog"]})
    outputs.close()
    assert sorted(path.name for path in (tmp_path / "labels").iterdir()) == ["a.txt", "clip_1.txt", "clip_2.txt"]
    assert (tmp_path / "labels" / "clip_1.txt").read_text() == "1 0.25 0.25 0.5 0.5\n"
    assert [record["frame"] for record in json.loads((tmp_path / "predictions.json").read_text())] == [0, 1, None]


def test_annotations_follow_line_width_and_show_labels_and_conf() -> None:
    """Ultralytics' ``line_width``, ``show_labels`` and ``show_conf``: the box's line as wide as asked, and the
    caption drawn only while it has something to say (its pixels above the box's top edge)."""
    from detector.workflows.outputs import annotate

    image = np.zeros((200, 200, 3), np.uint8)
    result = {"boxes": np.array([[40.0, 60, 160, 180]], np.float32), "scores": np.array([0.9], np.float32),
              "labels": np.array([0])}

    def drawn(**flags) -> np.ndarray:
        return annotate(image, result, ["cat"], **flags).any(-1)

    assert drawn(line_width=1)[120, 38:43].sum() < drawn(line_width=5)[120, 34:47].sum()  # the left edge, wider
    above = (slice(0, 57), slice(40, 200))  # where the caption goes: above the box
    assert drawn()[above].any() and drawn(show_conf=False)[above].any() and drawn(show_labels=False)[above].any()
    assert drawn(show_conf=False)[above].sum() < drawn()[above].sum()  # "cat" alone, shorter than "cat 0.90"
    assert not drawn(show_labels=False, show_conf=False)[above].any()
    # The caption sits on a filled box of the class colour (Ultralytics' label background): readable on any image.
    from detector.workflows.outputs import PALETTE

    # Its box here is rows 48-58, columns 40-73; bare strokes (before) fill under 1% of it in the class colour.
    caption = annotate(image, result, ["cat"])[48:59, 40:74]
    assert (caption == PALETTE[0]).all(-1).mean() > 0.4


def test_save_crop_writes_each_box_widened_as_ultralytics_under_its_class(tmp_path: Path) -> None:
    """``crops/<class>/<stem>.jpg``, then ``<stem>2.jpg`` for a second box of the class in the image; each crop the
    box, its sides x1.02 + 10 px about the centre, cut at the image's edge (Ultralytics' save_one_box); a video
    frame's crops carry the frame's number as its labels do."""
    import cv2

    from detector.workflows.outputs import Outputs

    rows, columns = np.mgrid[0:100, 0:120]
    image = np.stack([columns * 2, rows * 2, np.zeros_like(rows)], -1).astype(np.uint8)  # red: x, green: y
    outputs = Outputs(tmp_path, PredictOptions(source="x", save_crop=True), ["cat", "dog"])
    result = {"file": "a/x.jpg", "frame": None, "boxes": np.array([[20, 30, 70, 60], [0, 0, 50, 40], [60, 50, 119, 99]],
                                                                   np.float32),
              "scores": np.array([0.9, 0.8, 0.7], np.float32), "labels": np.array([0, 0, 1]),
              "names": ["cat", "cat", "dog"]}
    outputs.add(Frame("a/x.jpg", None, image), result)
    outputs.add(Frame("clip.mp4", 4, image, 25.0), {**result, "file": "clip.mp4", "frame": 4})
    # Frame 51 is clip_52, the name frame 4's second cat took: its cats take the next free names (clip_522, clip_523,
    # as Ultralytics' increment_path numbers them), nothing is overwritten.
    outputs.add(Frame("clip.mp4", 51, image, 25.0), {**result, "file": "clip.mp4", "frame": 51})
    outputs.close()
    found = sorted(path.relative_to(tmp_path / "crops").as_posix() for path in (tmp_path / "crops").rglob("*.jpg"))
    assert found == ["cat/a/x.jpg", "cat/a/x2.jpg", "cat/clip_5.jpg", "cat/clip_52.jpg", "cat/clip_522.jpg",
                     "cat/clip_523.jpg", "dog/a/x.jpg", "dog/clip_5.jpg", "dog/clip_52.jpg"]
    # Box 20-70 x 30-60: 51 + 10 = 61 wide about x 45 -> 14.5 .. 75.5 -> columns 14-75; 30.6 + 10 about y 45 ->
    # 24.7 .. 65.3 -> rows 24-65. JPEG moves a smooth image's pixels by a few levels: the shape is exact, the
    # content close (a crop one pixel off is 2 levels off throughout).
    crop = cv2.imread(str(tmp_path / "crops/cat/a/x.jpg"))[:, :, ::-1]
    assert crop.shape == (41, 61, 3)
    assert np.abs(crop.astype(int) - image[24:65, 14:75].astype(int)).mean() < 1.5
    assert cv2.imread(str(tmp_path / "crops/cat/a/x2.jpg")).shape[:2] == (45, 55)  # cut at the top-left corner
    assert cv2.imread(str(tmp_path / "crops/dog/a/x.jpg")).shape[:2] == (56, 66)  # and at the bottom-right


def test_sources_of_one_stem_keep_every_output(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """x.jpg and x.png, a list's two x.jpg, clip.mp4 and clip.avi: the later source's outputs get its suffix in their
    name, then a number, and a warning line says so; before, its labels (and a video: the whole video and
    predictions.json) were lost. A .jfif is annotated as .jpg: OpenCV writes no .jfif (the run stopped)."""
    from detector.workflows.outputs import Outputs

    image = np.zeros((16, 16, 3), np.uint8)
    result = {"boxes": np.array([[2, 2, 9, 9]], np.float32), "scores": np.array([0.9], np.float32),
              "labels": np.array([0]), "names": ["cat"]}
    outputs = Outputs(tmp_path, PredictOptions(source="x", save=True, save_txt=True), ["cat"])
    for name, index in [("x.jpg", None), ("x.png", None), ("x.png", None), ("y.jfif", None), ("clip.mp4", 0),
                        ("clip.mp4", 1), ("clip.avi", 0), ("clip.avi", 1)]:
        outputs.add(Frame(name, index, image, 5.0), {**result, "file": name, "frame": index})
    outputs.close()
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert written == ["clip.mp4", "clip_avi.mp4", "labels/clip_1.txt", "labels/clip_2.txt", "labels/clip_avi_1.txt",
                       "labels/clip_avi_2.txt", "labels/x.txt", "labels/x_png.txt", "labels/x_png_2.txt",
                       "labels/y.txt", "predictions.json", "x.jpg", "x_png.png", "x_png_2.png", "y.jpg"]
    assert len(json.loads((tmp_path / "predictions.json").read_text())) == 8
    warnings = capsys.readouterr().err.splitlines()
    assert warnings == ["warning: x.png: an earlier source's outputs are named x; this one's are x_png",
                        "warning: x.png: an earlier source's outputs are named x; this one's are x_png_2",
                        "warning: clip.avi: an earlier source's outputs are named clip; this one's are clip_avi"]


def test_crops_are_ultralytics_crops(tmp_path: Path) -> None:
    """The oracle where it is installed (the dev extra): ``save_one_box``'s crop, pixel for pixel, for boxes with
    fractional corners, inside the image and across its edges. In a process of its own: importing Ultralytics
    patches PIL's ``Image.open`` for the whole process (it then fails on files PIL cannot identify)."""
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("ultralytics") is None:  # found, not imported (above)
        pytest.skip("the oracle is Ultralytics' save_one_box (the dev extra)")
    from detector.workflows.outputs import crop_box

    image = np.random.default_rng(1).integers(0, 256, (90, 130, 3), dtype=np.uint8)
    corners = np.sort(np.random.default_rng(2).uniform(-20, 150, (40, 2, 2)), axis=1).transpose(0, 2, 1)
    boxes = corners.reshape(40, 4)[:, [0, 2, 1, 3]]  # x1 < x2, y1 < y2
    np.savez(tmp_path / "in.npz", image=image, boxes=boxes)
    oracle = ("import numpy as np, torch, sys; from ultralytics.utils.plotting import save_one_box; "
              "d = np.load(sys.argv[1]); np.savez(sys.argv[2], *[save_one_box(torch.tensor(b), d['image'], "
              "save=False, BGR=True) for b in d['boxes']])")
    subprocess.run([sys.executable, "-c", oracle, str(tmp_path / "in.npz"), str(tmp_path / "out.npz")], check=True,
                   capture_output=True, timeout=120)
    theirs = np.load(tmp_path / "out.npz")
    for index, box in enumerate(boxes.tolist()):
        np.testing.assert_array_equal(crop_box(image, box), theirs[f"arr_{index}"], err_msg=str(box))


def test_save_frames_writes_each_annotated_video_frame_as_an_image(tmp_path: Path) -> None:
    """Ultralytics' save_frames: a video's (or stream's) frames as <stem>_frames/<stem>_<n>.jpg, n from 1 as its
    labels; still images get none; without --save no video is written."""
    from detector.workflows.outputs import Outputs

    empty = {"boxes": np.zeros((0, 4), np.float32), "scores": np.zeros(0, np.float32),
             "labels": np.zeros(0, np.int64), "names": []}
    outputs = Outputs(tmp_path, PredictOptions(source="clip.mp4", save_frames=True), ["cat"])
    for index in (0, 3):  # --vid-stride 3: the kept frames keep their numbers
        outputs.add(Frame("clip.mp4", index, np.zeros((8, 8, 3), np.uint8), 5.0), {**empty, "file": "clip.mp4",
                                                                                  "frame": index})
    outputs.add(Frame("a.jpg", None, np.zeros((8, 8, 3), np.uint8)), {**empty, "file": "a.jpg", "frame": None})
    outputs.close()
    written = sorted(path.relative_to(tmp_path).as_posix() for path in tmp_path.rglob("*") if path.is_file())
    assert written == ["clip_frames/clip_1.jpg", "clip_frames/clip_4.jpg", "predictions.json"]
