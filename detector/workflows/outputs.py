"""What ``predict`` writes for each frame (:class:`Outputs`): annotated images and videos, YOLO txt labels, crops
and predictions.json, named so that no output overwrites another."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import cv2
import numpy as np

from detector.extras import Unavailable
from detector.files import write_image, write_text_atomically
from detector.inference.sources import Frame
from detector.workflows.options import PredictOptions

PALETTE = [(56, 56, 255), (151, 157, 255), (31, 112, 255), (29, 178, 255), (49, 210, 207), (10, 249, 72),
           (23, 204, 146), (134, 219, 61), (52, 147, 26), (187, 212, 0), (168, 153, 44), (255, 194, 0)]  # BGR


def annotate(image_rgb: np.ndarray, result: dict, names: list[str], *, line_width: int | None = None,
             show_labels: bool = True, show_conf: bool = True) -> np.ndarray:
    """-> BGR copy with one box per detection, captioned with its class name and score unless told not to;
    ``line_width`` in pixels (default: scaled to the image, as Ultralytics scales it)."""
    canvas = cv2.cvtColor(image_rgb, cv2.COLOR_RGB2BGR)
    thickness = line_width or max(1, round(sum(canvas.shape[:2]) / 600))
    for box, score, label in zip(result["boxes"].tolist(), result["scores"].tolist(), result["labels"].tolist()):
        colour = PALETTE[int(label) % len(PALETTE)]
        x1, y1, x2, y2 = (int(round(v)) for v in box)
        cv2.rectangle(canvas, (x1, y1), (x2, y2), colour, thickness, cv2.LINE_AA)
        caption = [names[int(label)] if int(label) < len(names) else str(label)] if show_labels else []
        text = " ".join(caption + ([f"{score:.2f}"] if show_conf else []))
        if text:
            caption_box(canvas, text, (x1, y1), colour, thickness)
    return canvas


def caption_box(canvas: np.ndarray, text: str, corner: tuple[int, int], colour: tuple[int, int, int],
                line_width: int) -> None:
    """``text`` on a filled box of the detection's colour above its top-left ``corner`` (inside the box where there
    is no room above), as Ultralytics draws captions: readable on any background. The text is white, or black on a
    light colour."""
    scale, weight = line_width / 3, max(line_width - 1, 1)
    (width, height), _ = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, scale, weight)
    x, y = corner
    above = y - height - 3 >= 0
    top, bottom = (y - height - 3, y) if above else (y, y + height + 3)
    cv2.rectangle(canvas, (x, top), (x + width, bottom), colour, -1, cv2.LINE_AA)
    ink = (0, 0, 0) if 0.114 * colour[0] + 0.587 * colour[1] + 0.299 * colour[2] > 160 else (255, 255, 255)  # BGR
    cv2.putText(canvas, text, (x, bottom - 2), cv2.FONT_HERSHEY_SIMPLEX, scale, ink, weight, cv2.LINE_AA)


def crop_box(image: np.ndarray, box: list[float], *, gain: float = 1.02, pad: int = 10) -> np.ndarray:
    """The part of ``image`` under one xyxy ``box``, widened as Ultralytics' ``save_crop`` widens it (each side
    times ``gain`` plus ``pad`` pixels, about the centre), cut at the image's edges; a view, maybe empty."""
    x1, y1, x2, y2 = box
    half_width, half_height = ((x2 - x1) * gain + pad) / 2, ((y2 - y1) * gain + pad) / 2
    centre_x, centre_y = (x1 + x2) / 2, (y1 + y2) / 2
    height, width = image.shape[:2]
    left, right = (min(max(int(v), 0), width) for v in (centre_x - half_width, centre_x + half_width))
    top, bottom = (min(max(int(v), 0), height) for v in (centre_y - half_height, centre_y + half_height))
    return image[top:bottom, left:right]


def to_record(result: dict) -> dict:
    """A :func:`predict` result as JSON values (boxes rounded to 0.01 px, scores to 1e-4)."""
    return {
        "file": result["file"],
        "frame": result["frame"],
        "boxes": [[round(v, 2) for v in box] for box in result["boxes"].tolist()],
        "scores": [round(v, 4) for v in result["scores"].tolist()],
        "labels": result["labels"].tolist(),
        "names": list(result["names"]),
    }


def yolo_lines(result: dict, height: int, width: int, *, with_score: bool) -> str:
    """A result as YOLO label lines: ``class cx cy w h [score]``, normalised to the image, 6 significant digits."""
    lines = []
    for (x1, y1, x2, y2), score, label in zip(result["boxes"].tolist(), result["scores"].tolist(),
                                              result["labels"].tolist()):
        values = [(x1 + x2) / 2 / width, (y1 + y2) / 2 / height, (x2 - x1) / width, (y2 - y1) / height]
        values += [score] if with_score else []
        lines.append(" ".join([str(int(label))] + [f"{value:.6g}" for value in values]) + "\n")
    return "".join(lines)


def output_stem(name: str) -> Path:
    """Where a frame's outputs go, without suffix: ``a/x.jpg`` -> ``a/x``; a URL -> its host and path as one name."""
    if "://" in name:
        return Path(re.sub(r"[^A-Za-z0-9._-]+", "_", name.split("://", 1)[1]).strip("_") or "stream")
    return Path(name).with_suffix("")


class Outputs:
    """What a run writes under its folder, one frame at a time: annotated images or videos, YOLO txt labels,
    and at :meth:`close` predictions.json (whole, atomically, for the frames done, even after Ctrl-C)."""

    def __init__(self, out_dir: Path, options: PredictOptions, names: list[str]) -> None:
        self.out_dir, self.options, self.names = out_dir, options, names
        self.records: list[str] = []
        self.videos: dict[str, cv2.VideoWriter] = {}
        self.staged: dict[str, tuple[Path, Path]] = {}
        self.crop_names: dict[Path, set[str]] = {}  # crops written so far, per class folder: none is overwritten
        self.stems: set[Path] = set()  # the sources' output names so far (claim_stem)
        self.video_stems: dict[str, Path] = {}

    def add(self, frame: Frame, result: dict) -> None:
        self.records.append(json.dumps(to_record(result)))
        stem = self.claim_stem(frame)
        # Video frames' files numbered from 1, as Ultralytics names them (clip_1.txt is predictions.json's frame 0).
        suffix = "" if frame.index is None else f"_{frame.index + 1}"
        if self.options.save_txt:
            text = yolo_lines(result, *frame.image.shape[:2], with_score=self.options.save_conf)
            # One file per image, empty when nothing was found: a processed background image, not a missing one.
            write_text_atomically(self.out_dir / "labels" / f"{stem}{suffix}.txt", text)
        if self.options.save_crop:
            self.save_crops(frame, result, f"{stem}{suffix}")
        options = self.options
        frames = options.save_frames and frame.index is not None
        if not options.save and not frames:
            return
        canvas = annotate(frame.image, result, self.names, line_width=options.line_width,
                          show_labels=options.show_labels, show_conf=options.show_conf)
        if frames:  # Ultralytics' save_frames: each annotated frame, numbered from 1 as its labels are
            write_image(self.out_dir / f"{stem}_frames" / f"{stem.name}{suffix}.jpg", canvas)
        if not options.save:
            return
        if frame.index is None:
            # In its own format where OpenCV writes it; as JPEG where it cannot (.jfif and .mpo are JPEGs already).
            kind = Path(frame.name).suffix if cv2.haveImageWriter(f"x{Path(frame.name).suffix}") else ".jpg"
            write_image(self.out_dir / f"{stem}{kind}", canvas)  # atomic
            return
        if frame.name not in self.videos:
            path = self.out_dir / f"{stem}.mp4"
            path.parent.mkdir(parents=True, exist_ok=True)
            staged = path.with_name(f".{path.stem}.partial.mp4")  # OpenCV picks the container by the suffix
            writer = cv2.VideoWriter(str(staged), cv2.VideoWriter_fourcc(*"mp4v"), frame.fps, canvas.shape[1::-1])
            if not writer.isOpened():
                raise Unavailable(f"{path}: cannot write video (this OpenCV build has no mp4v encoder)")
            self.videos[frame.name] = writer
            self.staged[frame.name] = (staged, path)
        self.videos[frame.name].write(canvas)

    def claim_stem(self, frame: Frame) -> Path:
        """The name (a path under the run folder, no suffix) of ``frame``'s outputs: its source's stem
        (:func:`output_stem`), one per source. A stem an earlier source of this run took (``x.jpg`` then ``x.png``;
        ``a/x.jpg`` and ``b/x.jpg`` in a list; ``clip.mp4`` then ``clip.avi``) gets the suffix in its name
        (``x_png``), then a number, with one warning line: no output overwrites another's. A video's frames
        share the stem its first frame claimed."""
        if frame.index is not None and frame.name in self.video_stems:
            return self.video_stems[frame.name]
        stem = output_stem(frame.name)
        if stem in self.stems:
            kind = Path(frame.name).suffix.lstrip(".")
            base = stem.with_name(f"{stem.name}_{kind}") if kind and "://" not in frame.name else stem
            candidate, count = base, 1
            while candidate in self.stems:
                count += 1
                candidate = base.with_name(f"{base.name}_{count}")
            print(f"warning: {frame.name}: an earlier source's outputs are named {stem.as_posix()}; this one's are "
                  f"{candidate.as_posix()}", file=sys.stderr)
            stem = candidate
        self.stems.add(stem)
        if frame.index is not None:
            self.video_stems[frame.name] = stem
        return stem

    def save_crops(self, frame: Frame, result: dict, stem: str) -> None:
        """Each detection's crop as ``crops/<class name>/<stem>.jpg``, then ``<stem>2.jpg`` ... for more of one
        class in one image, best first, as Ultralytics names them; a name this run has already written (a video's
        frame ``clip_1``'s second crop is ``clip_12``, frame 12's first) takes the next free number instead, as
        Ultralytics' ``increment_path`` does, so no crop overwrites another. A crop cut to nothing by the image's
        edge is not written."""
        for box, name in zip(result["boxes"].tolist(), result["names"]):
            crop = crop_box(frame.image, box)
            if not crop.size:
                continue
            folder = self.out_dir / "crops" / (name.replace("/", "_").replace(os.sep, "_") or "_")  # a name, no path
            taken = self.crop_names.setdefault(folder, set())
            count = 1
            while (candidate := f"{stem}{count if count > 1 else ''}.jpg") in taken:
                count += 1
            taken.add(candidate)
            write_image(folder / candidate, cv2.cvtColor(crop, cv2.COLOR_RGB2BGR))

    def close(self) -> None:
        try:
            for name, writer in self.videos.items():
                writer.release()
                staged, path = self.staged[name]
                os.replace(staged, path)  # each video appears whole, once its frames are in
        finally:  # a video that could not be finished loses no record
            # One record per line: readable, diffable, and still a single JSON list.
            text = "[\n" + ",\n".join(self.records) + "\n]\n" if self.records else "[]\n"
            write_text_atomically(self.out_dir / "predictions.json", text)
