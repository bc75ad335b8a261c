"""Ultralytics YOLO11 checkpoints: parity with Ultralytics itself, scale detection at every scale, the class branch
on another class count, and the models that still do not load (YOLO26's: tests/weights/test_yolo26_import.py).

Ultralytics (AGPL-3.0) is only an oracle here, and only in a child process (:data:`ORACLE`): it builds its models from
their YAMLs (random weights, nothing downloaded), saves them the ways Ultralytics 8.4 saves them and writes its raw
head outputs for fixed images; this process reads those files as a user's. The tests that need it skip without it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from detector.architecture import YOLO11_PREFIX, YOLO11_SCALES
from detector.model import build_model
from detector.weights import convert_state_dict, detect_scale, load_pretrained, read_ultralytics_checkpoint
from detector.weights.ultralytics import LAYERS, YOLO11_LAYERS
from tests.tolerances import fp32_tolerance
from tests.weights.oracle_child import PRELUDE, run_oracle
from tests.weights.lookalike import as_ultralytics_keys, lookalike_bytes

# Run as `python -c ORACLE OUT`: every file below, into OUT. The BN statistics and class biases are not at their
# defaults (mean 0, var 1 would hide a swapped or skipped tensor). "release": what Model.save writes (FP16 "model",
# "ema": None), as yolo11n.pt is published; "training": what BaseTrainer.save_model writes (FP16 "ema", "model": None,
# the optimizer's state and the run's arguments beside). The raw outputs are those of the file as Ultralytics reads
# it back, so both sides see the same FP16 rounding.
ORACLE = PRELUDE + r'''
out = sys.argv[1]
images = torch.rand(2, 3, 192, 320, generator=torch.Generator().manual_seed(5))  # non-square on purpose
torch.save(images, f"{out}/images.pt")

built = built_and_saved((("yolo11n", 0, "training"), ("yolo11m", 1, "release")))
fine_tuned("yolo11n.yaml", built["yolo11n"])  # the class branch at the source's width

YOLO("yolo11n-seg.yaml", verbose=False).save(f"{out}/yolo11n-seg.pt")  # another head (YOLO26: its own test file)
'''


@pytest.fixture(scope="module")
def oracle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder :data:`ORACLE` wrote, once per module (about 3 s on a 2-core CPU)."""
    if importlib.util.find_spec("ultralytics") is None:
        pytest.skip("ultralytics is not installed (the dev extra): it is the oracle")
    return run_oracle(ORACLE, tmp_path_factory.mktemp("yolo11-oracle"))


def _max_difference(model: torch.nn.Module, raw_file: Path, images: torch.Tensor) -> tuple[float, float]:
    """(largest |ours - theirs| over the raw head maps, its tolerance)."""
    with torch.no_grad():
        ours = model(images)
    flat = torch.cat([level.flatten(2) for level in ours], 2)  # [B, 64 + C, anchors], as Ultralytics concatenates
    theirs = torch.load(raw_file, weights_only=True)
    # Both sides run the same FP32 operations on the same FP16-stored weights, in the same order (our modules compute
    # each block as Ultralytics' do, the attention's (q * scale)^T @ k included) and with the same ATen kernels on one
    # CPU, so the maps come out bit-equal (measured: 0.0 on a 2-core x86 CPU). The one legitimate difference would be
    # a kernel adding a sum's terms in another order (oneDNN picks its algorithm by memory layout): tests/tolerances.py
    # bounds that, depth * sqrt(fan-in) * eps of the largest output, depth counting the convolutions and the
    # attention's two products. A swapped or mis-scaled tensor moves the maps by orders of magnitude more.
    tolerance = fp32_tolerance(model, ours, image_size=max(images.shape[-2:])).logit
    return (flat - theirs).abs().max().item(), tolerance


@pytest.mark.parametrize(("name", "scale"), [("yolo11n", "11n"), ("yolo11m", "11m")])  # m: C3k blocks, n: none
def test_raw_outputs_match_ultralytics(oracle: Path, name: str, scale: str) -> None:
    checkpoint = read_ultralytics_checkpoint(oracle / f"{name}.pt")
    assert (checkpoint.family, checkpoint.scale, checkpoint.num_classes, len(checkpoint.names)) == ("11", scale, 80, 80)
    assert checkpoint.source == ("ema" if name == "yolo11n" else "model")  # the training layout's EMA
    model = build_model(num_classes=80, scale=checkpoint.scale, class_channels=checkpoint.class_channels).eval()
    report = load_pretrained(model, checkpoint)
    assert report.reinitialised == () and report.matched == len(model.state_dict())
    assert report.summary().startswith(f"loaded {report.matched} tensors from {oracle / name}.pt (YOLO{scale}, 80 ")
    difference, tolerance = _max_difference(model, oracle / f"{name}.raw.pt", torch.load(oracle / "images.pt"))
    print(f"\nYOLO{scale}: max |raw output difference| = {difference:.3g} (tolerance {tolerance:.3g})")
    assert difference <= tolerance


def test_an_ultralytics_fine_tune_keeps_its_class_branch_width_and_runs_as_there(oracle: Path) -> None:
    """A 3-class YOLO11n fine-tuned from yolo11n.pt: its class branch is 80 wide (a fresh one is 64), and the width is
    read from the 1x1 conv after the branch's depthwise one (the depthwise conv keeps its input's width, 64)."""
    from detector.inference.pt_model import model_from_pt

    checkpoint = read_ultralytics_checkpoint(oracle / "fine-tuned.pt")
    assert (checkpoint.scale, checkpoint.num_classes, checkpoint.class_channels) == ("11n", 3, 80)
    model, meta = model_from_pt(oracle / "fine-tuned.pt")
    assert model.head.class_channels == 80 and meta["names"] == ["cat", "dog", "person"]
    difference, tolerance = _max_difference(model, oracle / "fine-tuned.raw.pt", torch.load(oracle / "images.pt"))
    assert difference <= tolerance


@pytest.mark.parametrize(("name", "problem"), [
    ("yolo11n-seg", r"not a YOLOv8, YOLO11 or YOLO26 detection model \(built from yolo11n-seg\.yaml: layer 23 is "
                    r"Segment, expected Detect\)"),
])
def test_other_ultralytics_models_are_refused_in_one_line(oracle: Path, name: str, problem: str) -> None:
    with pytest.raises(ValueError, match=rf"^{oracle / name}\.pt: {problem}.*; only YOLOv8, YOLO11 and YOLO26 "
                                         r"n/s/m/l/x detection weights are supported$") as refused:
        read_ultralytics_checkpoint(oracle / f"{name}.pt")
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("letter", list(YOLO11_SCALES))
def test_every_yolo11_scale_is_told_by_its_shapes(letter: str) -> None:
    """11m and 11l share the stem width (64): the depth tells them apart; 11n/11s from 11m/l/x: C3k blocks or not.
    The x model is 57M parameters: its tensors stay on the meta device (shapes only)."""
    name = YOLO11_PREFIX + letter
    ultralytics_keys = as_ultralytics_keys(name)
    assert detect_scale(ultralytics_keys) == name
    converted = convert_state_dict(ultralytics_keys, scale=name)
    with torch.device("meta"):
        assert converted.keys() == build_model(num_classes=80, scale=name).state_dict().keys()


def test_the_layer_tables_put_detect_where_the_yamls_do() -> None:
    from detector.architecture import HEAD_LAYER

    assert {family: len(layers) - 1 for family, layers in LAYERS.items()} == HEAD_LAYER == {"v8": 22, "11": 23,
                                                                                              "26": 23}
    assert YOLO11_LAYERS[10] == ("C2PSA", "psa")


@pytest.mark.parametrize(("scale", "fresh_modules"), [
    # 11n's branch is max(64, min(classes, 100)) wide: 80 at 80 classes, 64 at 3. Every module whose shape depends on
    # the width starts fresh; the depthwise conv on the branch's input (64 channels) keeps its weights.
    ("11n", {f"head.cv3.{level}.{module}" for level in range(3) for module in ("0.1", "1.0", "1.1", "2")}),
    ("11s", {f"head.cv3.{level}.2" for level in range(3)}),  # 128 wide at any class count: the logits alone
])
def test_another_class_count_reinitialises_exactly_what_depends_on_it(tmp_path: Path, scale: str,
                                                                      fresh_modules: set[str]) -> None:
    path = tmp_path / f"yolo{scale}.pt"
    path.write_bytes(lookalike_bytes(scale, num_classes=80))
    model = build_model(num_classes=3, scale=scale)
    before = {key: tensor.clone() for key, tensor in model.state_dict().items()}
    report = load_pretrained(model, path)
    incoming = convert_state_dict(read_ultralytics_checkpoint(path).state_dict)
    assert {key.rsplit(".", 2)[0] if ".bn." in key or ".conv." in key else key.rsplit(".", 1)[0]
            for key in report.reinitialised} == fresh_modules
    for key, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[key] if key in report.reinitialised else incoming[key]), key
    assert f"(YOLO{scale}, 80 classes); the model has 3 classes" in report.summary()
    # built at the file's width, as training builds it, only the logits start fresh (or from classes named alike)
    wide = build_model(num_classes=3, scale=scale, class_channels=read_ultralytics_checkpoint(path).class_channels)
    assert len(load_pretrained(wide, path).reinitialised) == 6


def test_a_yolov8_model_is_told_it_holds_yolo11_weights(tmp_path: Path) -> None:
    path = tmp_path / "yolo11n.pt"
    path.write_bytes(lookalike_bytes("11n"))
    with pytest.raises(ValueError, match=r"yolo11n\.pt: holds YOLO11n weights but the model is scale 'n'; build it "
                                         r"with scale='11n'"):
        load_pretrained(build_model(num_classes=80, scale="n"), path)


def test_the_readers_yolov8_era_names_still_import() -> None:
    """``convert_yolov8_state_dict`` and ``detect_yolov8_scale`` were public before YOLO11 loaded: the renamed
    functions answer to them."""
    import detector.weights as weights
    from detector.weights import convert_yolov8_state_dict, detect_yolov8_scale

    assert convert_yolov8_state_dict is weights.convert_state_dict and detect_yolov8_scale is weights.detect_scale
