"""Ultralytics YOLOv8 checkpoints: parity with Ultralytics itself, class-count changes, hostile files.

The Ultralytics models are built from their YAMLs (random weights, nothing downloaded) and saved the
ways Ultralytics 8.4 saves them; ``ultralytics`` is only an oracle here and the tests that need it
skip without it.
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from detector.model import build_model
from detector.postprocess import NMSConfig, postprocess
from detector.weights import (
    UnsafeCheckpointError,
    convert_state_dict,
    load_pretrained,
    read_ultralytics_checkpoint,
    resolve_weights,
)
from tests.tolerances import FP32_EPS, assert_same_detections, fp32_tolerance
from tests.weights.lookalike import yolov8_lookalike_bytes

os.environ.setdefault("YOLO_OFFLINE", "1")  # read by ultralytics at import: never reach the network


@pytest.fixture(scope="module", autouse=True)
def _the_process_as_it_was() -> Iterator[None]:
    """Importing ultralytics patches the process for good: ``PIL.Image.open`` (a corrupt image then tries to
    pip-install pi-heif and raises ModuleNotFoundError), ``torch.save``, OpenCV's thread count, NumPy's print
    options and environment variables. The tests that run after these in the same process (any order, any
    worker) must see the libraries as a user of detector does."""
    import cv2
    import numpy as np
    from PIL import Image

    opened, saved, threads, environment, printing = (Image.open, torch.save, cv2.getNumThreads(), dict(os.environ),
                                                     np.get_printoptions())
    yield
    Image.open, torch.save = opened, saved
    cv2.setNumThreads(threads)
    os.environ.clear()
    os.environ.update(environment)
    np.set_printoptions(**printing)


def _ultralytics_model(yaml_name: str, seed: int = 0):
    """An Ultralytics ``YOLO`` whose BN statistics and class biases are not at their defaults.

    Default BN (mean 0, var 1, weight 1, bias 0) would hide a swapped or skipped tensor; random class
    biases spread the scores so that NMS has real work to do.
    """
    ultralytics = pytest.importorskip("ultralytics")
    torch.manual_seed(seed)
    wrapper = ultralytics.YOLO(yaml_name, verbose=False)
    network = wrapper.model
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in network.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.weight.uniform_(0.5, 1.5, generator=generator)
                module.bias.normal_(0.0, 0.2, generator=generator)
                module.running_mean.normal_(0.0, 0.2, generator=generator)
                module.running_var.uniform_(0.5, 2.0, generator=generator)
        for branch in network.model[-1].cv3:
            branch[-1].bias.normal_(-6.0, 2.0, generator=generator)
    return wrapper


def _save_release(wrapper, path: Path) -> None:
    """The layout of released ``yolov8n.pt`` files: ``Model.save`` writes an FP16 ``"model"`` and ``"ema": None``."""
    wrapper.save(path)


def _save_training(wrapper, path: Path) -> None:
    """What ``BaseTrainer.save_model`` writes in Ultralytics 8.4 (last.pt / best.pt): FP16 EMA, ``"model": None``."""
    from ultralytics import __version__
    from ultralytics.cfg import get_cfg
    from ultralytics.utils.torch_utils import convert_optimizer_state_dict_to_fp16

    network, args = wrapper.model, get_cfg()
    network.nc, network.names, network.args = 80, {i: f"class{i}" for i in range(80)}, args  # set_model_attributes
    optimizer = torch.optim.SGD(network.parameters(), lr=0.01, momentum=0.9)
    for parameter in network.parameters():
        parameter.grad = torch.zeros_like(parameter)  # one zero step: momentum buffers, unchanged weights
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    ema = copy.deepcopy(network).half().to(memory_format=torch.contiguous_format)
    checkpoint = {
        "epoch": 3,
        "best_fitness": 0.1,
        "stopper": {"best_fitness": 0.1, "best_epoch": 3},
        "model": None,
        "ema": ema,
        "updates": 120,
        "modelopt": None,
        "optimizer": convert_optimizer_state_dict_to_fp16(copy.deepcopy(optimizer.state_dict())),
        "scaler": torch.amp.GradScaler("cpu", enabled=False).state_dict(),
        "train_args": vars(args),
        "train_metrics": {"metrics/mAP50(B)": 0.2, "fitness": 0.1},
        "train_results": {"epoch": [1, 2, 3], "metrics/mAP50(B)": [0.1, 0.15, 0.2]},
        "date": "2025-01-01T00:00:00+00:00",
        "version": __version__,
        "git": {"root": None, "branch": None, "commit": None, "message": None, "origin": None},
        "license": "AGPL-3.0 (https://ultralytics.com/license)",
        "docs": "https://docs.ultralytics.com",
    }
    torch.save(checkpoint, path)


@pytest.fixture(scope="module")
def saved_checkpoint(tmp_path_factory: pytest.TempPathFactory):
    """``saved_checkpoint(arch, layout) -> Path``, each file built once per module (building yolov8s is slow)."""
    files: dict[tuple[str, str], Path] = {}

    def get(arch: str, layout: str = "release") -> Path:
        if (arch, layout) not in files:
            path = tmp_path_factory.mktemp(layout) / f"{arch}.pt"
            save = {"release": _save_release, "training": _save_training}[layout]
            save(_ultralytics_model(f"{arch}.yaml"), path)
            files[arch, layout] = path
        return files[arch, layout]

    return get


def _synthetic_images(batch: int = 2, height: int = 192, width: int = 320) -> torch.Tensor:
    """``[B, 3, H, W]`` in [0, 1]: colour gradients with solid rectangles on top (non-square on purpose)."""
    generator = torch.Generator().manual_seed(1)
    rows, cols = torch.meshgrid(torch.linspace(0, 1, height), torch.linspace(0, 1, width), indexing="ij")
    images = torch.stack((cols, rows, 1 - rows * cols)).repeat(batch, 1, 1, 1) * 0.6
    for image in images:
        for _ in range(8):
            top, left = (torch.randint(0, limit - 48, (1,), generator=generator).item() for limit in (height, width))
            box_height, box_width = torch.randint(16, 48, (2,), generator=generator).tolist()
            image[:, top : top + box_height, left : left + box_width] = torch.rand(3, 1, 1, generator=generator)
    return images


@pytest.mark.parametrize(("scale", "layout"), [("n", "training"), ("s", "release")])
def test_outputs_match_ultralytics(saved_checkpoint, scale: str, layout: str) -> None:
    pytest.importorskip("ultralytics")
    from ultralytics.utils.nms import non_max_suppression

    path = saved_checkpoint(f"yolov8{scale}", layout)
    # The oracle is the file as Ultralytics reads it back, so both sides see the same FP16 rounding.
    stored = torch.load(path, map_location="cpu", weights_only=False)
    oracle = (stored["ema"] or stored["model"]).float().eval()
    checkpoint = read_ultralytics_checkpoint(path)
    assert checkpoint.scale == scale
    assert checkpoint.num_classes == 80 and len(checkpoint.names) == 80
    model = build_model(num_classes=80, scale=scale).eval()
    report = load_pretrained(model, checkpoint)
    assert report.reinitialised == () and report.matched == len(model.state_dict())

    images = _synthetic_images()
    with torch.no_grad():
        ours = model(images)
        decoded, raw = oracle(images)
    tolerance = fp32_tolerance(model, ours, image_size=max(images.shape[-2:]))
    ours_flat = torch.cat([level.flatten(2) for level in ours], 2)  # [B, 64 + C, anchors]
    theirs_flat = torch.cat((raw["boxes"], raw["scores"]), 1)
    max_diff = (ours_flat - theirs_flat).abs().max().item()
    print(f"\nYOLOv8{scale}: max |raw output difference| = {max_diff:.3g} (tolerance {tolerance.logit:.3g})")
    assert max_diff <= tolerance.logit

    # Random weights give arbitrary score levels, packed within ~1e-3 of each other: put the threshold in the
    # widest gap below the 50th best score (over both images), so NMS has work and no score sits on the threshold.
    ranked = decoded[:, 4:].amax(1).flatten().sort(descending=True).values
    gap, rank = (ranked[50:-1] - ranked[51:]).max(0)
    assert gap / 2 > tolerance.score, "no score gap wider than the tolerance to put the threshold in"
    nms = NMSConfig(float(ranked[50 + rank] + ranked[51 + rank]) / 2, 0.7)
    our_detections = postprocess(ours, strides=model.strides, reg_max=16, config=nms)
    their_detections = non_max_suppression(decoded, conf_thres=nms.conf_threshold, iou_thres=nms.iou_threshold,
                                           max_det=nms.max_detections)
    theirs = [{"boxes": rows[:, :4], "scores": rows[:, 4], "labels": rows[:, 5].long()} for rows in their_detections]
    print(f"YOLOv8{scale}: detections per image {[len(image['boxes']) for image in our_detections]} "
          f"at confidence > {nms.conf_threshold:.3g}")
    # Ultralytics separates classes by adding label * 7680 px to the boxes before its IoU: coordinates up to
    # 7680 * 80 ~ 6.1e5 px carry float32 rounding of eps times that (0.07 px), which widens its NMS borderline.
    # The raw outputs agree anchor by anchor (above), so a box kept on one side only can be a tie swap:
    # random weights give many equal scores, and each NMS breaks ties its own way.
    summary = assert_same_detections(our_detections, theirs, nms=nms, tolerance=tolerance,
                                     box_slack=FP32_EPS * 7680 * 80, tie_swaps=True)
    print(f"YOLOv8{scale}: {summary}")


def test_ema_is_preferred_over_model(tmp_path: Path) -> None:
    ema = _ultralytics_model("yolov8n.yaml").model
    live = copy.deepcopy(ema)
    live.model[0].conv.weight.data.zero_()
    path = tmp_path / "both.pt"
    torch.save({"model": live.half(), "ema": ema.half()}, path)
    checkpoint = read_ultralytics_checkpoint(path)
    assert checkpoint.source == "ema"
    torch.testing.assert_close(checkpoint.state_dict["model.0.conv.weight"], ema.model[0].conv.weight.detach())


@pytest.mark.parametrize(
    ("scale", "expected"),
    [
        # yolov8s's class branch is 128 wide whatever the class count: only the final convs change.
        ("s", {f"head.cv3.{level}.2.{name}" for level in range(3) for name in ("weight", "bias")}),
        # yolov8n's is max(64, min(classes, 100)) wide: 80 classes -> 80, 3 -> 64, so the whole branch changes.
        ("n", None),
    ],
)
def test_other_class_count_reinitialises_only_the_class_branch(saved_checkpoint, scale: str, expected) -> None:
    path = saved_checkpoint(f"yolov8{scale}")
    model = build_model(num_classes=3, scale=scale)
    fresh = {key: tensor.clone() for key, tensor in model.state_dict().items()}
    report = load_pretrained(model, path)
    incoming = convert_state_dict(read_ultralytics_checkpoint(path).state_dict)

    loaded = model.state_dict()
    if expected is None:
        expected = {key for key in loaded if key.startswith("head.cv3.")}
    assert set(report.reinitialised) == expected
    assert report.source_num_classes == 80 and "3 classes" in report.summary()
    for key, tensor in loaded.items():
        assert torch.equal(tensor, fresh[key] if key in expected else incoming[key]), key


def test_wrong_scale_and_other_architectures_are_named(saved_checkpoint) -> None:
    path = saved_checkpoint("yolov8s")
    with pytest.raises(ValueError, match=r"yolov8s\.pt: holds YOLOv8s weights but the model is scale 'n'"):
        load_pretrained(build_model(num_classes=80, scale="n"), path)

    path = saved_checkpoint("yolov8n-p2")  # an extra head level: another layout than YOLOv8's (or YOLO11's)
    with pytest.raises(ValueError, match=r"yolov8n-p2\.pt: not a YOLOv8, YOLO11 or YOLO26 detection model \(built "
                                         r"from yolov8n-p2\.yaml: layer 16 is Upsample, expected Conv\); only YOLOv8, "
                                         r"YOLO11 and YOLO26 n/s/m/l/x detection weights are supported$"):
        read_ultralytics_checkpoint(path)


class _Exploit:
    """Pickles as a call to ``function(*args)``: what a hostile checkpoint would contain."""

    def __init__(self, function, args) -> None:
        self.function, self.args = function, args

    def __reduce__(self):
        return self.function, self.args


@pytest.mark.parametrize("attack", ["os.system", "builtins.eval", "subprocess.Popen"])
def test_hostile_pickle_is_refused(tmp_path: Path, attack: str) -> None:
    marker = Path("/tmp") / f"pwned_{uuid.uuid4().hex}"
    payload = {
        "os.system": (os.system, (f"touch {marker}",)),
        "builtins.eval": (eval, (f"__import__('os').system('touch {marker}')",)),
        "subprocess.Popen": (subprocess.Popen, (["touch", str(marker)],)),
    }[attack]
    path = tmp_path / "yolov8n.pt"
    torch.save({"model": {"layer": _Exploit(*payload)}, "ema": None}, path)
    # os.system pickles under its defining module, which is "posix" on Linux and "nt" on Windows.
    refused = attack.replace("os.", f"{os.name}.") if attack == "os.system" else attack
    with pytest.raises(UnsafeCheckpointError, match=rf"^{re.escape(str(path))}: refuses to load global '{refused}'$"):
        load_pretrained(build_model(num_classes=80, scale="n"), path)
    assert not marker.exists()


@pytest.mark.filterwarnings("ignore::FutureWarning")  # torch.jit is deprecated, but old archives still exist
def test_torchscript_archive_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "scripted.pt"
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), path)
    with pytest.raises(UnsafeCheckpointError, match="TorchScript"):
        read_ultralytics_checkpoint(path)


def test_missing_weights_name_where_we_looked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"'yolov8_missing\.pt' not found .*weights.*by hand") as error:
        resolve_weights("yolov8_missing.pt")
    assert "\n" not in str(error.value)
    with pytest.raises(FileNotFoundError, match="yolov8_missing.pt"):
        load_pretrained(build_model(num_classes=80, scale="n"), "yolov8_missing.pt")


def test_bare_name_is_found_in_the_weights_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    weights_dir, elsewhere = tmp_path / "weights", tmp_path / "elsewhere"
    weights_dir.mkdir(), elsewhere.mkdir()
    (weights_dir / "yolov8n.pt").touch()
    monkeypatch.chdir(elsewhere)
    assert resolve_weights("yolov8n.pt", weights_dir=weights_dir) == weights_dir / "yolov8n.pt"
    (elsewhere / "yolov8n.pt").touch()  # an existing path wins over the weights folder
    assert resolve_weights("yolov8n.pt", weights_dir=weights_dir) == Path("yolov8n.pt")


def test_exported_onnx_matches_ultralytics(saved_checkpoint, tmp_path: Path) -> None:
    """The whole chain: Ultralytics file -> our model -> our FP32 ONNX export, against Ultralytics itself."""
    pytest.importorskip("ultralytics")
    pytest.importorskip("onnx", reason="the chain ends in an ONNX export (the 'export' extra)")
    ort = pytest.importorskip("onnxruntime")

    from detector.model.metadata import ModelInfo
    from detector.exporting.onnx import export_onnx

    path = saved_checkpoint("yolov8n", "training")
    stored = torch.load(path, map_location="cpu", weights_only=False)
    oracle = (stored["ema"] or stored["model"]).float().eval()
    model = build_model(num_classes=80, scale="n").eval()
    load_pretrained(model, read_ultralytics_checkpoint(path))
    onnx_path = export_onnx(model, tmp_path / "v8n.onnx", ModelInfo(names=[f"c{i}" for i in range(80)],
                                                                    strides=model.strides, imgsz=320, dynamic=True))
    images = _synthetic_images()
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    boxes, scores = session.run(None, {session.get_inputs()[0].name: images.numpy()})
    with torch.no_grad():
        decoded, _ = oracle(images)  # [B, 4 + C, A]: cx, cy, w, h pixels, then class probabilities
        tolerance = fp32_tolerance(model, model(images), image_size=max(images.shape[-2:]))
    cx, cy, w, h = decoded[:, :4].unbind(1)
    their_boxes = torch.stack((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2), -1)
    box_diff = (torch.from_numpy(boxes) - their_boxes).abs().max().item()
    score_diff = (torch.from_numpy(scores) - decoded[:, 4:].transpose(1, 2)).abs().max().item()
    print(f"\nYOLOv8n ONNX vs Ultralytics: max box diff {box_diff:.3g} px, max score diff {score_diff:.3g} ({tolerance})")
    assert box_diff <= tolerance.box and score_diff <= tolerance.score

    # Detections after NMS are not compared here: this random-weight model's boxes and scores are full of
    # near-ties, and ~1e-7 differences reorder them, so NMS keeps different but equivalent boxes. The
    # PyTorch-model test above compares NMS output where both sides are bit-identical.


@pytest.mark.parametrize("content, problem", [
    ("custom-width", "unrecognised YOLOv8 size: stem width 24"),
    ("empty", "empty or cut short"),
    ("cut", "custom.pt"),
])
def test_weights_without_a_scale_or_cut_short_are_one_line(tmp_path: Path, content: str, problem: str) -> None:
    path = tmp_path / "custom.pt"
    whole = yolov8_lookalike_bytes("n", stem_width=24)
    path.write_bytes({"custom-width": whole, "empty": b"", "cut": whole[: len(whole) // 2]}[content])
    with pytest.raises(ValueError, match=problem) as refused:
        read_ultralytics_checkpoint(path)
    assert str(refused.value).startswith(str(path)) and "\n" not in str(refused.value)


def _ultralytics_fine_tune(tmp_path: Path, names: dict[int, str]) -> tuple[Path, torch.nn.Module]:
    """What Ultralytics 8.4 keeps from ``YOLO("yolov8n.pt").train(data=<3 classes>)``: a 3-class nano whose class
    branch was rebuilt at the 80-class source's width (80, where a fresh 3-class nano has 64) by its ``load``."""
    from ultralytics.nn.tasks import DetectionModel

    source = _ultralytics_model("yolov8n.yaml").model
    tuned = DetectionModel("yolov8n.yaml", nc=len(names), verbose=False)
    tuned.names = dict(names)
    tuned.load(source, verbose=False)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for branch in tuned.model[-1].cv3:
            branch[-1].bias.normal_(-6.0, 2.0, generator=generator)
    path = tmp_path / "fine-tuned.pt"
    torch.save({"model": copy.deepcopy(tuned).half(), "ema": None}, path)
    return path, source


def test_an_ultralytics_fine_tune_keeps_its_class_branch_width_and_runs_as_there(tmp_path: Path) -> None:
    """The file most Ultralytics users bring (a nano fine-tuned from yolov8n.pt on fewer classes) did not load:
    "weights do not fit the model (33 tensors differ: head.cv3.0.0.bn.bias (80,) vs (64,) ...)"."""
    pytest.importorskip("ultralytics")
    from detector.inference.pt_model import model_from_pt

    path, _ = _ultralytics_fine_tune(tmp_path, {0: "cat", 1: "dog", 2: "person"})
    checkpoint = read_ultralytics_checkpoint(path)
    assert (checkpoint.num_classes, checkpoint.class_channels) == (3, 80)
    model, meta = model_from_pt(path)
    assert model.head.class_channels == 80 and meta["names"] == ["cat", "dog", "person"]
    stored = torch.load(path, map_location="cpu", weights_only=False)
    oracle = stored["model"].float().eval()
    images = _synthetic_images()
    with torch.no_grad():
        ours = model(images)
        _, raw = oracle(images)
    tolerance = fp32_tolerance(model, ours, image_size=max(images.shape[-2:]))
    ours_flat = torch.cat([level.flatten(2) for level in ours], 2)
    assert (ours_flat - torch.cat((raw["boxes"], raw["scores"]), 1)).abs().max().item() <= tolerance.logit


def test_fine_tuning_keeps_the_source_width_and_moves_class_rows_by_name(saved_checkpoint) -> None:
    """As Ultralytics 8.4 fine-tunes: the class branch is built at the weights' width, so its hidden layers load;
    the final convs' rows of classes named alike (any case) start from those classes; the rest stay fresh."""
    path = saved_checkpoint("yolov8n", "training")  # 80 classes named class0 ... class79
    checkpoint = read_ultralytics_checkpoint(path)
    names = ["CLASS7", "zebra", "class2"]
    model = build_model(num_classes=3, scale="n", class_channels=checkpoint.class_channels)
    fresh = {key: tensor.clone() for key, tensor in model.state_dict().items()}
    report = load_pretrained(model, checkpoint, names)
    incoming = convert_state_dict(checkpoint.state_dict)
    loaded = model.state_dict()
    assert report.named == 2 and report.reinitialised == ()
    assert "2 of the model's 3 classes start from the weights' class of the same name, 1 fresh" in report.summary()
    for key, tensor in loaded.items():
        if re.fullmatch(r"head\.cv3\.\d\.2\.(weight|bias)", key):
            assert torch.equal(tensor[0], incoming[key][7]) and torch.equal(tensor[2], incoming[key][2]), key
            assert torch.equal(tensor[1], fresh[key][1]), key  # "zebra": no class of that name
        else:
            assert torch.equal(tensor, incoming[key]), key  # the hidden layers included: same width
    # Without names the rows stay where they are: a different count leaves the final convs fresh.
    plain = build_model(num_classes=3, scale="n", class_channels=checkpoint.class_channels)
    assert len(load_pretrained(plain, checkpoint).reinitialised) == 6


def test_val_predict_export_and_load_find_a_bare_name_where_train_does(tmp_path: Path, monkeypatch) -> None:
    """``download yolov8n`` puts the file in the weights folder, and ``train --weights yolov8n.pt`` found it there;
    ``predict``, ``val``, ``export`` and ``load`` said "weights not found"."""
    from detector.inference import weights_or_latest
    from detector.weights.locate import located
    from tests.weights.lookalike import yolov8_lookalike_bytes

    monkeypatch.setenv("DETECTOR_HOME", str(tmp_path / "home"))
    (tmp_path / "home" / "weights").mkdir(parents=True)
    (tmp_path / "home" / "weights" / "yolov8n.pt").write_bytes(yolov8_lookalike_bytes("n", num_classes=3))
    monkeypatch.chdir(tmp_path)
    assert located("yolov8n.pt") == weights_or_latest("yolov8n.pt") == tmp_path / "home" / "weights" / "yolov8n.pt"
    import detector

    assert detector.load("yolov8n.pt").names == ["class0", "class1", "class2"]
    assert located("mine.pt") == Path("mine.pt")  # not there: as given, for the caller's own "not found"
    with pytest.raises(FileNotFoundError, match=r"fetch it: python -m detector download yolov8s$"):
        located("yolov8s.pt")
    with pytest.raises(FileNotFoundError, match=r"fetch it: python -m detector download yolo11n$"):
        located("yolo11n.pt")
    with pytest.raises(FileNotFoundError, match=r"fetch it: python -m detector download yolo26n$"):
        located("yolo26n.pt")
    with pytest.raises(FileNotFoundError, match=r"YOLO12 weights would not load here either: only YOLOv8, YOLO11 and "
                                                r"YOLO26 detection weights are"):
        located("yolo12n.pt")  # val, predict, export, benchmark and load() say it as train does
