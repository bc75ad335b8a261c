"""Shared fixtures: tiny datasets written by the tests themselves (no downloads, no shared data)."""

from __future__ import annotations

import faulthandler
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import cv2
import numpy as np
import pytest
import torch

from detector.checkpoint import save_checkpoint
from detector.data.build import SplitData, build_split
from detector.data.records import Records
from detector.data.spec import load_dataset_spec
from detector.data.synthetic import make_image, write_yolo_split
from detector.exporting.parity import synthetic_images
from detector.loss import DetectionLoss
from detector.model import YOLO, build_model
from detector.precision import Precision
from detector.training.ema import ModelEMA
from detector.training.engine import TrainStep
from detector.training.optim import build_optimizer
from detector.training.schedule import StepSchedule

NAMES = ["circle", "square", "triangle"]
MODEL_IMGSZ = 64  # input size of the small checkpoints the export and inference tests share


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Run torch on one intra-op thread, then restore the setting.

    The test machines share 2 cores between workers; there, OpenMP barriers between two threads make
    64 px convolutions ~5x slower than one thread (measured on the export tests: 118 s -> 22 s).
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@pytest.fixture(scope="session", autouse=True)
def _one_thread_for_tiny_models() -> Iterator[None]:
    """The whole suite runs its tiny models on one intra-op thread (see :func:`one_torch_thread` for why).

    Subprocesses the tests start set ``OMP_NUM_THREADS=1`` for the same reason.
    """
    with one_torch_thread():
        yield


@pytest.fixture
def watchdog() -> Iterator[None]:
    """A test that forks: if it hangs, the run ends after 120 s with every thread's traceback."""
    faulthandler.dump_traceback_later(120, exit=True, file=sys.__stderr__)
    yield
    faulthandler.cancel_dump_traceback_later()


class FakeClock:
    """A clock in seconds for code that takes one (``clock=``): set or advance ``now`` by hand; each reading moves
    it on by ``tick`` (0: it stands still), so the time between two readings, such as a timed write, is ``tick``."""

    def __init__(self, now: float = 0.0, tick: float = 0.0) -> None:
        self.now, self.tick = now, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


def write_yolo_dataset(root: Path, *, train: int = 8, val: int = 4, size: int = 64, seed: int = 0) -> Path:
    """Synthetic shapes in YOLO layout (images/ + labels/) with a data YAML; returns the YAML path."""
    for split, count in (("train", train), ("val", val)):
        write_yolo_split(root, split, count, size, seed, suffix=".png")
    yaml_path = root / "data.yaml"
    yaml_path.write_text(f"path: .\ntrain: images/train\nval: images/val\nnames: {NAMES}\n")
    return yaml_path


def write_coco_dataset(root: Path, *, count: int = 4, size: int = 64, seed: int = 1) -> Path:
    """The same kind of images with a COCO instances JSON (category ids 7, 9, 11 to test the mapping)."""
    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True, exist_ok=True)
    category_ids = [7, 9, 11]
    images, annotations = [], []
    for index in range(count):
        image, labels = make_image(rng, size)
        name = f"{index:03d}.jpg"
        cv2.imwrite(str(root / "images" / name), image)
        images.append({"id": 100 + index, "file_name": name, "width": size, "height": size})
        for cls, cx, cy, w, h in labels.tolist():
            box = [(cx - w / 2) * size, (cy - h / 2) * size, w * size, h * size]
            annotations.append({"id": len(annotations) + 1, "image_id": 100 + index,
                                "category_id": category_ids[int(cls)], "bbox": box, "area": box[2] * box[3], "iscrowd": 0})
    categories = [{"id": cid, "name": name} for cid, name in zip(category_ids, NAMES)]
    (root / "instances.json").write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    yaml_path = root / "coco.yaml"
    yaml_path.write_text(
        "path: .\ntrain: {json: instances.json, images: images}\nval: {json: instances.json, images: images}\n"
        f"names: {NAMES}\n"
    )
    return yaml_path


VocObject = tuple[str, int, int, int, int, int]  # name, xmin, ymin, xmax, ymax (1-based pixels), difficult


def voc_xml(objects: list[VocObject], *, width: int = 64, height: int = 48) -> str:
    """A Pascal VOC annotation as the devkit writes it (only the fields the conversion reads, plus a few)."""
    parts = [f"<annotation><folder>VOC</folder><size><width>{width}</width><height>{height}</height>"
             "<depth>3</depth></size>"]
    for name, xmin, ymin, xmax, ymax, difficult in objects:
        parts.append(f"<object><name>{name}</name><pose>Unspecified</pose><truncated>0</truncated>"
                     f"<difficult>{difficult}</difficult><bndbox><xmin>{xmin}</xmin><ymin>{ymin}</ymin>"
                     f"<xmax>{xmax}</xmax><ymax>{ymax}</ymax></bndbox></object>")
    return "".join(parts) + "</annotation>\n"


def write_voc_devkit(folder: Path, year: str, image_set: str, annotations: dict[str, str]) -> Path:
    """``folder/VOCdevkit/VOC<year>``: a 64x48 JPEG and the given XML per image id, and the set's id list."""
    devkit = folder / "VOCdevkit" / f"VOC{year}"
    for sub in ("Annotations", "JPEGImages", "ImageSets/Main"):
        (devkit / sub).mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(len(annotations))
    for image_id, xml in annotations.items():
        (devkit / "Annotations" / f"{image_id}.xml").write_text(xml)
        cv2.imwrite(str(devkit / "JPEGImages" / f"{image_id}.jpg"), rng.integers(0, 255, (48, 64, 3), np.uint8))
    (devkit / "ImageSets/Main" / f"{image_set}.txt").write_text("".join(f"{i}\n" for i in annotations))
    return devkit


@pytest.fixture
def yolo_yaml(tmp_path: Path) -> Path:
    return write_yolo_dataset(tmp_path / "yolo")


@pytest.fixture
def coco_yaml(tmp_path: Path) -> Path:
    return write_coco_dataset(tmp_path / "coco")


def lively_model(seed: int = 0, *, randomise_boxes: bool = True, num_classes: int = len(NAMES),
                 scale: str = "n") -> YOLO:
    """A model (YOLOv8n unless ``scale`` says) with varied scores (and, by default, varied box bins); a fresh one is
    near-uniform.

    BatchNorm statistics are calibrated on a few images (fresh BN stats shrink activations to ~1e-9 by
    the head), then the last class convs (and box convs) get random weights: scores spread over (0, 1).
    """
    torch.manual_seed(seed)
    model = build_model(num_classes=num_classes, scale=scale)
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.reset_running_stats()
            module.momentum = None  # cumulative average: one pass sets the statistics
    with torch.no_grad():
        model.train()(synthetic_images(MODEL_IMGSZ, count=8, seed=1).float() / 255)
        # YOLO26's one-to-one branch too, after the usual one (so the other models draw the same numbers as before):
        # its own scores and boxes, not the copy it starts as.
        heads = [(model.head.cv2, model.head.cv3)]
        heads += [(model.head.one2one_cv2, model.head.one2one_cv3)] if model.head.end_to_end else []
        for box_branches, class_branches in heads:
            for box_branch, class_branch in zip(box_branches, class_branches):
                class_branch[-1].weight.normal_(0, 0.01)
                class_branch[-1].bias.fill_(-1.0)
                if randomise_boxes:
                    box_branch[-1].weight.normal_(0, 0.01)
    return model.eval()


def write_checkpoint(model: YOLO, path: Path, imgsz: int = MODEL_IMGSZ) -> Path:
    """A training-style checkpoint (no EMA) for ``model``, class names :data:`NAMES`."""
    model_args = {"num_classes": model.num_classes, "scale": model.scale, "reg_max": model.reg_max}
    payload = {"model": model.state_dict(), "ema": None, "model_args": model_args, "names": NAMES,
               "config": {"imgsz": imgsz}, "epoch": 0}
    save_checkpoint(payload, path)
    return path


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TINY_NAMES = ["square", "bar"]
# Per image: (height, width) and YOLO label rows (class, cx, cy, w, h normalised).
TINY_IMAGES = [
    ((64, 64), [(0, 0.30, 0.30, 0.25, 0.25), (1, 0.70, 0.70, 0.30, 0.15)]),
    ((48, 64), [(0, 0.50, 0.50, 0.40, 0.40)]),
    ((64, 64), [(1, 0.40, 0.60, 0.50, 0.20)]),
    ((64, 48), []),  # background image
]


@pytest.fixture
def assert_png() -> Callable[[Path], np.ndarray]:
    """Check a file is a decodable PNG of non-trivial size; return the decoded BGR array."""

    def check(path: Path, min_side: int = 32) -> np.ndarray:
        path = Path(path)
        assert path.is_file(), path
        assert path.read_bytes()[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
        image = cv2.imread(str(path), cv2.IMREAD_COLOR)
        assert image is not None and min(image.shape[:2]) >= min_side, f"{path} did not decode to a real image"
        return image

    return check


def write_tiny_dataset(root: Path) -> Path:
    """Write ``TINY_IMAGES`` as PNGs with filled rectangles and YOLO labels; return the data YAML path."""
    images_dir, labels_dir = root / "images" / "val", root / "labels" / "val"
    images_dir.mkdir(parents=True)
    labels_dir.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for index, ((height, width), rows) in enumerate(TINY_IMAGES):
        image = rng.integers(0, 60, (height, width, 3), dtype=np.uint8)
        for cls, cx, cy, w, h in rows:
            x1, y1 = round((cx - w / 2) * width), round((cy - h / 2) * height)
            x2, y2 = round((cx + w / 2) * width), round((cy + h / 2) * height)
            image[y1:y2, x1:x2] = (200, 80, 80) if cls == 0 else (80, 200, 80)
        cv2.imwrite(str(images_dir / f"img{index}.png"), image)
        if rows:
            lines = [" ".join(str(value) for value in row) for row in rows]
            (labels_dir / f"img{index}.txt").write_text("\n".join(lines) + "\n")
    yaml_path = root / "tiny.yaml"
    yaml_path.write_text(f"path: {root}\ntrain: images/val\nval: images/val\nnames: {TINY_NAMES}\n")
    return yaml_path


@pytest.fixture
def tiny_split(tmp_path: Path) -> SplitData:
    """The tiny dataset's val split, letterboxed to 64 x 64, with its COCO ground truth."""
    spec = load_dataset_spec(write_tiny_dataset(tmp_path / "data"))
    return build_split(spec, "val", image_size=64, augment=None, cache="false")


# The nano checkpoint shared by the command and inference tests, and its FP32 ONNX export.
@pytest.fixture(scope="session")
def session_model() -> YOLO:
    """The model behind the session's checkpoint and ONNX export; no folder overrides this name. Built from
    ``model``, which tests/exporting overrides, they were cached with whichever ``model`` asked first: a worker that
    ran an export test first gave the inference tests another model's checkpoint (a CI run failed on it)."""
    return lively_model(randomise_boxes=False)  # scores varied, so NMS has no ties to break


@pytest.fixture(scope="session")
def model(session_model: YOLO) -> YOLO:
    return session_model


@pytest.fixture(scope="session")
def checkpoint(session_model: YOLO, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(session_model, tmp_path_factory.mktemp("weights") / "best.pt")


@pytest.fixture(scope="session")
def onnx_fp32(session_model: YOLO, checkpoint: Path) -> Path:
    """Fixed-shape FP32 export with batch 2 (so a 3-image batch exercises the chunking)."""
    pytest.importorskip("onnx", reason="the ONNX backend needs an ONNX export (the 'export' extra)")
    pytest.importorskip("onnxruntime", reason="the ONNX backend runs on onnxruntime (the 'export' extra)")
    from detector.exporting import export_onnx  # imports onnx
    from detector.model.metadata import ModelInfo

    info = ModelInfo(names=NAMES, strides=session_model.strides, imgsz=MODEL_IMGSZ, batch=2)
    return export_onnx(session_model, checkpoint.with_suffix(".onnx"), info)


def write_records(folder: Path, count: int, seed: int) -> Records:
    """``count`` synthetic 64 px PNGs in ``folder`` with their labels, as dataset records (ids 0..count-1)."""
    rng = np.random.default_rng(seed)
    paths, labels = [], []
    for index in range(count):
        image, boxes = make_image(rng, 64)
        paths.append(folder / f"{index}.png")
        cv2.imwrite(str(paths[-1]), image)
        labels.append(boxes)
    return Records.from_lists(paths, labels, range(count), [(64, 64)] * count)


def make_train_step(
    model: YOLO, *, precision: str = "fp32", optimizer: str = "AdamW", lr: float = 1e-3, ema: bool = True,
    channels_last: bool = False, steps_per_epoch: int = 2, device: str = "cpu",
) -> TrainStep:
    """A :class:`TrainStep` (on the CPU unless ``device``; ``model`` already there) without warm-up or decay: the
    loop, the probe and the AMP check take one."""
    choice = build_optimizer(model, name=optimizer, lr=lr, momentum=0.9, weight_decay=0.0,
                             num_classes=model.num_classes, total_steps=steps_per_epoch)
    schedule = StepSchedule(epochs=1, steps_per_epoch=steps_per_epoch, warmup_steps=0, base_lr=choice.lr,
                            final_lr_fraction=1.0, cosine=False, warmup_bias_lr=0.0, warmup_momentum=0.9,
                            momentum=0.9, batch_size=2, nominal_batch=2, clip_grad=10.0)
    chosen = Precision(precision, torch.device(device).type, "test")
    criterion = DetectionLoss.for_model(model).to(device)
    return TrainStep(model, criterion, choice.optimizer, chosen.make_scaler(), ModelEMA(model) if ema else None,
                     chosen, schedule, torch.device(device), channels_last=channels_last)


# make test hands whole files to its two workers in collection order (pytest-xdist --dist loadfile
# --no-loadscope-reorder); these take 20 s to 1.5 min each, so they go first, and the many short files even out the
# end instead of one worker finishing a long file alone. A worker takes its next file when it has two tests or fewer
# left, so the one-test test_install.py comes with test_distributed.py: 41 + 93 s on one worker against
# 66 + 68 s for test_export_pt2.py and test_trainer.py on the other (measured on a 2-core AMD EPYC).
SLOWEST_FILES = ("exporting/test_export_pt2.py", "test_install.py", "test_distributed.py", "training/test_trainer.py",
                 "test_tolerances.py", "data/test_warp_kernel.py",
                 "training/test_cuda_graph.py")  # ~27 s with a GPU (an H200), skipped without one


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.path.as_posix()
        return next((i for i, name in enumerate(SLOWEST_FILES) if path.endswith(f"tests/{name}")), len(SLOWEST_FILES))

    items.sort(key=rank)  # stable: the order within a file, and of every other file, stays
