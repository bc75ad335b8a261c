"""Ultralytics YOLO26 checkpoints: parity with Ultralytics itself on both head branches, the family told from YOLO11's
(same layer types), scale detection at every scale, fine-tuning onto other classes, and the YOLO26 files still refused.

Ultralytics (AGPL-3.0) is only an oracle here, and only in a child process (:data:`ORACLE`): it builds its models from
their YAMLs (random weights, nothing downloaded), saves them the ways Ultralytics 8.4 saves them and writes its raw
head outputs for fixed images, one file per branch; this process reads those files as a user's. The tests that need it
skip without it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from detector.architecture import YOLO26_PREFIX, YOLO26_SCALES
from detector.model import build_model
from detector.weights import convert_state_dict, detect_scale, load_pretrained, read_ultralytics_checkpoint
from detector.weights.ultralytics import LAYERS, YOLO11_LAYERS, YOLO26_LAYERS, family_of_keys
from tests.tolerances import fp32_tolerance
from tests.weights.oracle_child import PRELUDE, run_oracle
from tests.weights.lookalike import as_ultralytics_keys, lookalike_bytes

# Run as `python -c ORACLE OUT`: every file below, into OUT. The BN statistics and the class biases are not at their
# defaults, and the one-to-one branch (at first a copy of the usual one) gets its own: a branch read into the other's
# place, or a skipped tensor, moves the outputs. "release": what Model.save writes (FP16 "model", "ema": None), as
# yolo26n.pt is published; "training": what BaseTrainer.save_model writes (FP16 "ema", "model": None, the optimizer's
# state beside). The raw outputs are those of the file as Ultralytics reads it back (eval mode: a (y, preds) tuple
# whose preds hold each branch's "boxes" [B, 4, A] and "scores" [B, nc, A]).
ORACLE = PRELUDE + r'''
out = sys.argv[1]
images = torch.rand(2, 3, 160, 224, generator=torch.Generator().manual_seed(7))  # non-square on purpose
torch.save(images, f"{out}/images.pt")

built = built_and_saved((("yolo26n", 0, "training"), ("yolo26m", 1, "release")))
fine_tuned("yolo26n.yaml", built["yolo26n"])  # both class branches at the source's width

# Refused: YOLO26 segmentation (another head), and yolo26n.yaml built without its one-to-one branch (end2end: False).
YOLO("yolo26n-seg.yaml", verbose=False).save(f"{out}/yolo26n-seg.pt")
spec = yaml_model_load("yolo26n.yaml")
spec["end2end"] = False
torch.save({"model": DetectionModel(spec, nc=80, verbose=False).half(), "ema": None}, f"{out}/one-branch.pt")
'''


@pytest.fixture(scope="module")
def oracle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder :data:`ORACLE` wrote, once per module (a few seconds on a 2-core CPU)."""
    if importlib.util.find_spec("ultralytics") is None:
        pytest.skip("ultralytics is not installed (the dev extra): it is the oracle")
    return run_oracle(ORACLE, tmp_path_factory.mktemp("yolo26-oracle"))


def _flat(model: torch.nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Our raw maps for ``images`` flattened as Ultralytics concatenates them, ``[B, 4 + C, anchors]``, and the maps."""
    with torch.no_grad():
        maps = model(images)
    return torch.cat([level.flatten(2) for level in maps], 2), maps


def _branches(model: torch.nn.Module, oracle: Path, name: str) -> dict[str, tuple[float, float]]:
    """Per branch, (largest |ours - theirs| over the raw head outputs, the FP32 summation-order bound): the one-to-one
    branch's are ours with ``head.one_to_one`` set (our default in evaluation is the usual branch, as Ultralytics
    8.4's)."""
    images = torch.load(oracle / "images.pt")
    results = {}
    for branch, one_to_one in (("one2many", False), ("one2one", True)):
        model.head.one_to_one = one_to_one
        ours, maps = _flat(model, images)
        theirs = torch.load(oracle / f"{name}.{branch}.pt", weights_only=True)
        # The bound (tests/tolerances.py: what another summation order alone could change) is only reported: both
        # sides run the same FP32 operations on the same FP16-stored weights in the same order, on one thread each
        # (the oracle's OMP_NUM_THREADS), with the same ATen kernels, so the outputs are asserted bit-equal.
        tolerance = fp32_tolerance(model, maps, image_size=max(images.shape[-2:])).logit
        results[branch] = ((ours - theirs).abs().max().item(), tolerance)
    model.head.one_to_one = False
    return results


@pytest.mark.parametrize(("name", "scale"), [("yolo26n", "26n"), ("yolo26m", "26m")])  # m: C3k blocks in the backbone
def test_both_branches_match_ultralytics(oracle: Path, name: str, scale: str) -> None:
    checkpoint = read_ultralytics_checkpoint(oracle / f"{name}.pt")
    assert (checkpoint.family, checkpoint.scale, checkpoint.num_classes, len(checkpoint.names)) == ("26", scale, 80, 80)
    assert checkpoint.source == ("ema" if name == "yolo26n" else "model")  # the training layout's EMA
    assert not any(key.startswith("model.23.dfl.") for key in checkpoint.state_dict)  # no DFL bins: reg_max 1
    model = build_model(num_classes=80, scale=checkpoint.scale, class_channels=checkpoint.class_channels).eval()
    assert model.reg_max == 1 and model.head.end_to_end
    report = load_pretrained(model, checkpoint)
    assert report.reinitialised == () and report.matched == len(model.state_dict()) == len(checkpoint.state_dict)
    assert report.summary().startswith(f"loaded {report.matched} tensors from {oracle / name}.pt (YOLO{scale}, 80 ")
    results = _branches(model, oracle, name)
    for branch, (difference, tolerance) in results.items():
        print(f"\nYOLO{scale} {branch}: max |raw output difference| = {difference:.3g} (FP32 bound {tolerance:.3g})")
        assert difference == 0.0, f"{branch}: {difference:.3g} (a summation order alone could give {tolerance:.3g})"
    # The branches' outputs differ (the oracle gave them different weights), so each was compared with its own.
    one2many = torch.load(oracle / f"{name}.one2many.pt", weights_only=True)
    one2one = torch.load(oracle / f"{name}.one2one.pt", weights_only=True)
    assert (one2many - one2one).abs().max().item() > 100 * max(tolerance for _, tolerance in results.values())


def test_an_ultralytics_fine_tune_keeps_both_class_branches_width_and_runs_as_there(oracle: Path) -> None:
    """A 3-class YOLO26n fine-tuned from an 80-class one: both class branches are 80 wide (a fresh one is 64)."""
    from detector.inference.pt_model import model_from_pt

    checkpoint = read_ultralytics_checkpoint(oracle / "fine-tuned.pt")
    assert (checkpoint.family, checkpoint.scale, checkpoint.num_classes, checkpoint.class_channels) == ("26", "26n", 3,
                                                                                                       80)
    model, meta = model_from_pt(oracle / "fine-tuned.pt")
    assert model.head.class_channels == 80 and meta["names"] == ["cat", "dog", "person"]
    for branch, (difference, _) in _branches(model, oracle, "fine-tuned").items():
        assert difference == 0.0, branch


@pytest.mark.parametrize(("name", "problem"), [
    ("yolo26n-seg", r"not a YOLOv8, YOLO11 or YOLO26 detection model \(built from yolo26n-seg\.yaml: layer 23 is "
                    r"\w+, expected Detect\)"),
    # YOLO11's layer types without a one-to-one branch: read as YOLO11, whose head has 64 box channels, not 4
    ("one-branch", r"not a standard YOLO11n detection model \(built from yolo26n\.yaml: \d+ tensors differ from ours"),
])
def test_other_yolo26_models_are_refused_in_one_line(oracle: Path, name: str, problem: str) -> None:
    with pytest.raises(ValueError, match=rf"^{oracle / name}\.pt: {problem}.*; only YOLOv8, YOLO11 and YOLO26 "
                                         r"n/s/m/l/x detection weights are supported$") as refused:
        read_ultralytics_checkpoint(oracle / f"{name}.pt")
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("letter", list(YOLO26_SCALES))
def test_every_yolo26_scale_is_told_by_its_shapes(letter: str) -> None:
    """Each scale's family and scale from its tensors alone (the x model, 59M parameters, on the meta device)."""
    name = YOLO26_PREFIX + letter
    ultralytics_keys = as_ultralytics_keys(name)
    assert family_of_keys(ultralytics_keys) == "26"
    assert detect_scale(ultralytics_keys) == name
    converted = convert_state_dict(ultralytics_keys, scale=name)
    assert any(key.startswith("head.one2one_cv3.2.2.") for key in converted)
    with torch.device("meta"):
        assert converted.keys() == build_model(num_classes=80, scale=name).state_dict().keys()


@pytest.mark.parametrize(("scale", "family"), [("n", "v8"), ("11n", "11"), ("11m", "11"), ("26n", "26"), ("26s", "26")])
def test_each_family_is_read_as_itself(tmp_path: Path, scale: str, family: str) -> None:
    """YOLO11 and YOLO26 share their layer types: a YOLO11 file stays YOLO11 (and YOLOv8 v8) now that YOLO26 loads."""
    path = tmp_path / f"{scale}.pt"
    path.write_bytes(lookalike_bytes(scale))
    checkpoint = read_ultralytics_checkpoint(path)
    assert (checkpoint.family, checkpoint.scale) == (family, scale)
    model = build_model(num_classes=80, scale=scale)
    assert load_pretrained(model, checkpoint).matched == len(model.state_dict())


def test_yolo26_numbers_its_layers_as_yolo11() -> None:
    """Same types at the same indices (what --freeze counts and the reader renames by); what differs is inside them."""
    assert LAYERS["26"] is YOLO26_LAYERS == YOLO11_LAYERS and YOLO26_LAYERS[22] == ("C3k2", "bottom_up5")


def test_fine_tuning_onto_three_classes_starts_both_class_branches_alike(tmp_path: Path) -> None:
    """The one-to-one class branch (head.one2one_cv3) is treated exactly as head.cv3: at another class count its
    logits (and, at another width, its hidden layers) start fresh, and rows of classes named alike move in both."""
    path = tmp_path / "yolo26n.pt"
    path.write_bytes(lookalike_bytes("26n", num_classes=80))
    incoming = convert_state_dict(read_ultralytics_checkpoint(path).state_dict)
    narrow = build_model(num_classes=3, scale="26n")  # 64 wide: every module whose shape depends on it starts fresh
    fresh = {f"head.{branch}.{level}.{module}" for branch in ("cv3", "one2one_cv3") for level in range(3)
             for module in ("0.1", "1.0", "1.1", "2")}
    reinitialised = load_pretrained(narrow, path).reinitialised
    assert {key.rsplit(".", 2)[0] if ".bn." in key or ".conv." in key else key.rsplit(".", 1)[0]
            for key in reinitialised} == fresh
    wide = build_model(num_classes=3, scale="26n", class_channels=80)  # as training builds it: the logits alone
    before = {key: tensor.clone() for key, tensor in wide.state_dict().items()}
    report = load_pretrained(wide, path, names=["class7", "bird", "class2"])
    assert report.named == 2 and len(report.reinitialised) == 0  # every logit tensor has moved rows
    for branch in ("cv3", "one2one_cv3"):
        for level in range(3):
            key = f"head.{branch}.{level}.2.weight"
            logits = wide.state_dict()[key]
            assert torch.equal(logits[0], incoming[key][7]) and torch.equal(logits[2], incoming[key][2]), key
            assert torch.equal(logits[1], before[key][1]), key  # "bird": no such class in the file, fresh
    assert "2 of the model's 3 classes start from the weights' class of the same name" in report.summary()
