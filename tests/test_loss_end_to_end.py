"""YOLO26's criterion (an end-to-end head: two branches, direct box distances) against Ultralytics' ``E2ELoss`` on
identical random head outputs and targets. Ultralytics runs in a child process (see tests/test_loss_oracle.py)."""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys

import pytest
import torch

from detector.boxes import distances_to_boxes, flatten_head_outputs, make_anchors
from detector.loss import DetectionLoss, LossGains, complete_iou_loss, one_to_many_weight
from tests.test_loss_oracle import BOX_COUNTS, FP32_EPS, NUM_CLASSES, box_gap, random_targets, score_tolerance

STRIDES, IMAGE_HW, EPOCH, EPOCHS = (8, 16, 32), (96, 128), 3, 10

# The child: Ultralytics' E2ELoss at the same epoch, with spies on both branches' assigners and losses.
ORACLE = """
import sys, types
import torch
from torch import nn
from ultralytics.utils.loss import E2ELoss

case = torch.load(sys.argv[1])
head = types.SimpleNamespace(stride=torch.tensor(case["strides"], dtype=torch.float), nc=case["classes"], reg_max=1)
model = nn.Module()
model.model, model.args = [head], types.SimpleNamespace(epochs=case["epochs"], **case["gains"])
model.weight = nn.Parameter(torch.zeros(1))
criterion = E2ELoss(model)
for _ in range(case["epoch"]):
    criterion.update()
seen = {}
for name in ("one2many", "one2one"):
    branch = getattr(criterion, name)
    def spy(*args, _assigner=branch.assigner, _name=name, **kwargs):
        seen[_name] = _assigner(*args, **kwargs)
        return seen[_name]
    branch.assigner = spy
preds = {}
for name, maps in (("one2many", case["many"]), ("one2one", case["one"])):
    flat = torch.cat([o.flatten(2) for o in maps], 2)
    preds[name] = {"boxes": flat[:, :4], "scores": flat[:, 4:], "feats": maps}
targets = case["targets"]
batch = {"batch_idx": targets[:, 0], "cls": targets[:, 1:2], "bboxes": targets[:, 2:]}
total, items = criterion(preds, batch)
parts = {name: getattr(criterion, name).get_assigned_targets_and_loss(preds[name], batch)[1]
         for name in ("one2many", "one2one")}
out = {"total": total, "o2m": criterion.o2m, "decays": [criterion.decay(e) for e in range(case["epochs"] + 2)]}
for name in ("one2many", "one2one"):
    _, boxes, scores, foreground, _ = seen[name]
    out[name] = {"loss": parts[name], "boxes": boxes, "scores": scores, "foreground": foreground}
torch.save(out, sys.argv[2])
"""


def random_maps(generator: torch.Generator) -> list[torch.Tensor]:
    """A branch's raw maps: 4 distances (grid units, about 0.5-6 cells, mostly positive) and the class logits."""
    maps = []
    for stride in STRIDES:
        shape = (len(BOX_COUNTS), 4 + NUM_CLASSES, IMAGE_HW[0] // stride, IMAGE_HW[1] // stride)
        values = torch.randn(shape, generator=generator) * 2
        values[:, :4] = values[:, :4].abs() * 1.5 + 0.5
        maps.append(values)
    return maps


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict, DetectionLoss, dict]:
    if importlib.util.find_spec("ultralytics") is None:
        pytest.skip("ultralytics (the dev extra) is not installed")
    generator = torch.Generator().manual_seed(26)
    many, one = random_maps(generator), random_maps(generator)
    gains = LossGains()
    case = {"many": many, "one": one, "targets": random_targets(generator), "strides": STRIDES, "classes": NUM_CLASSES,
            "epoch": EPOCH, "epochs": EPOCHS, "gains": {"box": gains.box, "cls": gains.cls, "dfl": gains.dfl}}
    criterion = DetectionLoss(num_classes=NUM_CLASSES, strides=STRIDES, reg_max=1, end_to_end=True)
    criterion.set_epoch(EPOCH, EPOCHS)
    total, parts = criterion(many + one, case["targets"], IMAGE_HW, keep_assignment=True)
    ours = {"total": total, "parts": parts}
    folder = tmp_path_factory.mktemp("oracle")
    torch.save(case, folder / "case.pt")
    env = {**os.environ, "YOLO_OFFLINE": "1", "YOLO_CONFIG_DIR": str(folder)}
    result = subprocess.run([sys.executable, "-c", ORACLE, str(folder / "case.pt"), str(folder / "theirs.pt")],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    return case, ours, criterion, torch.load(folder / "theirs.pt")


def test_the_branch_weights_follow_ultralytics_decay(compared) -> None:
    """The same formula in the same order: equal floats, in every epoch and past the last (resumed longer)."""
    _, _, criterion, theirs = compared
    assert [one_to_many_weight(epoch, EPOCHS) for epoch in range(EPOCHS + 2)] == theirs["decays"]
    assert float(criterion.many_weight) == pytest.approx(theirs["o2m"], abs=FP32_EPS)  # kept in an FP32 buffer


@pytest.mark.parametrize("branch", [0, 1])
def test_each_branch_assigns_as_ultralytics(compared, branch: int) -> None:
    """The usual branch takes each box's top 10 anchors, the one-to-one branch its best of 7: one anchor a box."""
    _, _, criterion, theirs = compared
    assigned = criterion.last_assignment[branch]
    reference = theirs[("one2many", "one2one")[branch]]
    foreground = assigned.foreground
    assert foreground.any() and not foreground[1].any()
    # As in tests/test_loss_oracle.py: an anchor whose CIoU with every box that picked it is 0 goes to no box here.
    assert not (foreground & ~reference["foreground"]).any()
    assert (reference["scores"][reference["foreground"] & ~foreground] == 0).all()
    assert torch.equal(assigned.boxes[foreground], reference["boxes"][foreground])
    assert (assigned.scores - reference["scores"]).abs().max() <= score_tolerance()
    if branch == 1:  # at most one positive anchor per box: boxes in the images minus the empty one
        assert int(foreground.sum()) <= sum(BOX_COUNTS)


def test_the_losses_are_ultralytics(compared) -> None:
    """The usual branch's parts (what is logged here; Ultralytics logs the other's) and the weighted total. Bounds as in
    tests/test_loss_oracle.py's test_each_loss_component_is_ultralytics: a part moves by ``gain * tau *
    (sum(sensitivity) + n_fg * part / gain) / S`` with the target scores (tau), by the box term's definition gap, and
    by its sum's order. The L1 term is the same function on both sides (its sensitivity: its own size, as DFL's)."""
    case, ours, criterion, theirs = compared
    gains, tau = LossGains(), score_tolerance()
    bounds = {}
    for branch, maps in enumerate((case["many"], case["one"])):
        assigned = criterion.last_assignment[branch]
        flat = flatten_head_outputs(maps)
        points, stride = make_anchors([o.shape[2:] for o in maps], STRIDES, device=torch.device("cpu"),
                                      dtype=torch.float32)
        fg = assigned.foreground
        anchor = points.expand(len(flat), -1, -1)[fg]
        pred, target = distances_to_boxes(anchor, flat[..., :4][fg]), (assigned.boxes / stride)[fg]
        count, score_sum = int(fg.sum()), float(assigned.scores.sum().clamp(min=1))
        class_logits = flat[..., 4:].gather(2, assigned.labels[..., None])[..., 0][fg]
        # Each anchor's L1 term: the mean of its four distance errors, each as a share of the image's width or height.
        side = torch.cat((stride / IMAGE_HW[1], stride / IMAGE_HW[0]) * 2, -1).expand(len(flat), -1, -1)[fg]
        errors = flat[..., :4][fg] - torch.cat((anchor - target[:, :2], target[:, 2:] - anchor), -1)
        terms = {"box": complete_iou_loss(pred, target), "cls": class_logits.abs(),
                 "dfl": (errors * side).abs().mean(-1)}
        own = {"box": gains.box * box_gap(pred, target), "cls": 0.0, "dfl": 0.0}
        sizes = {"box": count, "cls": flat[..., 4:].numel(), "dfl": 4 * count}
        name_of = ("one2many", "one2one")[branch]
        bounds[branch] = 0.0
        for index, name in enumerate(("box", "cls", "dfl")):
            gain, expected = getattr(gains, name), float(theirs[name_of]["loss"][index])
            bound = gain * tau * (float(terms[name].sum()) + count * expected / gain + 1) / score_sum + own[name]
            bound += math.sqrt(sizes[name]) * FP32_EPS * abs(expected)
            bounds[branch] += bound
            if branch == 0:
                got = float(ours["parts"][name])
                assert abs(got - expected) <= bound, (name, got, expected, bound)
    weight = theirs["o2m"]
    # The total is batch * (w * many + (1 - w) * one): each branch's sum moves by its bound, then 4 roundings.
    expected, got = float(theirs["total"].sum()), float(ours["total"])
    bound = len(BOX_COUNTS) * (weight * bounds[0] + (1 - weight) * bounds[1]) + 4 * FP32_EPS * abs(expected)
    assert abs(got - expected) <= bound, (got, expected, bound)


def test_one_branch_of_maps_is_scored_alone(compared) -> None:
    """A validation pass decodes the usual branch alone (3 maps): its loss is that branch's, the parts training logs."""
    case, ours, criterion, _ = compared
    total, parts = criterion(case["many"], case["targets"], IMAGE_HW)
    for name in ("box", "cls", "dfl"):
        assert torch.equal(parts[name], ours["parts"][name])
    assert float(total) == pytest.approx(sum(float(v) for v in parts.values()) * len(BOX_COUNTS), rel=1e-6)
    with pytest.raises(ValueError, match="expected 3 head maps"):
        criterion(case["many"][:2], case["targets"], IMAGE_HW)
