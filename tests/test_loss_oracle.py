"""The criterion and its assigner against Ultralytics' own (``v8DetectionLoss``, ``TaskAlignedAssigner``), the
reference a dev extra brings, on identical random head outputs and targets: several images, one crowded, one
empty, boxes under a stride wide, two stride layouts. Ultralytics runs in a child process: importing it patches
this one for good (``PIL.Image.open`` among others)."""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys

import pytest
import torch

from detector.boxes import boxes_to_distances, dfl_expectation, distances_to_boxes, flatten_head_outputs, make_anchors
from detector.loss import DetectionLoss, LossGains, complete_iou_loss, distribution_focal_loss, frequency_weights

FP32_EPS = torch.finfo(torch.float32).eps
CIOU_EPS = 1e-7  # what both CIoU forms add to heights, unions and diagonals
NUM_CLASSES, REG_MAX = 3, 16
# Per image: its box count (the second empty, the third crowded); boxes 0.01-0.51 of the side, so some are under
# one stride wide.
BOX_COUNTS = (5, 0, 40, 2)
LAYOUTS = (((8, 16, 32), (64, 96)), ((16, 32, 64), (128, 128)))

# The child: Ultralytics' criterion on each saved case, with a spy on its assigner for the targets it gives.
ORACLE = """
import sys, types
import torch
from torch import nn
from ultralytics.utils.loss import v8DetectionLoss

results = []
for case in torch.load(sys.argv[1]):
    head = types.SimpleNamespace(stride=torch.tensor(case["strides"], dtype=torch.float), nc=case["classes"],
                                 reg_max=16)
    model = nn.Module()
    model.model, model.args = [head], types.SimpleNamespace(**case["gains"])
    model.weight = nn.Parameter(torch.zeros(1))  # the criterion reads its device from a parameter
    criterion = v8DetectionLoss(model)
    assigner, seen = criterion.assigner, {}
    def spy(*args, **kwargs):
        seen["targets"] = assigner(*args, **kwargs)
        return seen["targets"]
    criterion.assigner = spy
    outputs, targets = case["outputs"], case["targets"]
    flat = torch.cat([o.flatten(2) for o in outputs], 2)
    preds = {"boxes": flat[:, :64], "scores": flat[:, 64:], "feats": outputs}
    batch = {"batch_idx": targets[:, 0], "cls": targets[:, 1:2], "bboxes": targets[:, 2:]}
    loss = criterion.get_assigned_targets_and_loss(preds, batch)[1]  # gains applied, not times the batch
    _, boxes, scores, foreground, _ = seen["targets"]
    results.append({"loss": loss, "boxes": boxes, "scores": scores, "foreground": foreground})
torch.save(results, sys.argv[2])
"""


def random_targets(generator: torch.Generator) -> torch.Tensor:
    """``[N, 6]`` rows (image, class, cx, cy, w, h normalised), :data:`BOX_COUNTS` boxes per image."""
    rows = []
    for image, count in enumerate(BOX_COUNTS):
        centres = torch.rand(count, 2, generator=generator) * 0.8 + 0.1
        sides = torch.rand(count, 2, generator=generator) * 0.5 + 0.01
        labels = torch.randint(0, NUM_CLASSES, (count, 1), generator=generator).float()
        rows.append(torch.cat([torch.full((count, 1), float(image)), labels, centres, sides], 1))
    return torch.cat(rows)


def random_case(seed: int, strides: tuple[int, ...], image_hw: tuple[int, int]) -> dict:
    generator = torch.Generator().manual_seed(seed)
    batch = len(BOX_COUNTS)
    # Logits of spread 2: boxes from a few cells to the whole image, scores from near 0 to near 1.
    outputs = [torch.randn(batch, 4 * REG_MAX + NUM_CLASSES, image_hw[0] // s, image_hw[1] // s,
                           generator=generator) * 2 for s in strides]
    targets = random_targets(generator)
    gains = LossGains()
    return {"outputs": outputs, "targets": targets, "strides": strides, "image_hw": image_hw,
            "classes": NUM_CLASSES, "gains": {"box": gains.box, "cls": gains.cls, "dfl": gains.dfl}}


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[dict, dict, dict]]:
    """Per case: (the case, ours: parts and assignment, Ultralytics' loss and targets)."""
    if importlib.util.find_spec("ultralytics") is None:  # looked for, not imported (see above)
        pytest.skip("ultralytics (the dev extra) is not installed")
    folder = tmp_path_factory.mktemp("oracle")
    cases = [random_case(seed, strides, hw) for seed, (strides, hw) in enumerate(LAYOUTS)]
    ours = []
    for case in cases:
        criterion = DetectionLoss(num_classes=NUM_CLASSES, strides=case["strides"])
        _, parts = criterion(case["outputs"], case["targets"], case["image_hw"], keep_assignment=True)
        ours.append({"parts": parts, "assigned": criterion.last_assignment})
    torch.save(cases, folder / "cases.pt")
    env = {**os.environ, "YOLO_OFFLINE": "1", "YOLO_CONFIG_DIR": str(folder)}
    result = subprocess.run([sys.executable, "-c", ORACLE, str(folder / "cases.pt"), str(folder / "theirs.pt")],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    return list(zip(cases, ours, torch.load(folder / "theirs.pt")))


def score_tolerance(alpha: float = 0.5, beta: float = 6.0) -> float:
    """How far two correct FP32 evaluations of one target score may differ (absolute).

    Both sides do the same IEEE operations in the same order, except that a transcendental (sigmoid, pow, atan) may
    round differently (<= 1 ulp each way) where one evaluates it in a vectorised loop and the other in scalar code,
    or over all pairs and the other over the candidates. The CIoU moves by at most 16 eps that way (its two angles,
    each <= pi/2, through ``v = 4/pi^2 * d^2`` and ``alpha * v``). A score is ``m * a_j / a_max`` with
    ``a = s**alpha * ciou**beta`` and ``m`` the best CIoU <= 1; ``a_j / a_max`` <= 1 moves by at most ``beta``
    times the CIoU's change for each of ``a_j`` and ``a_max``, and by ``2 * alpha`` eps for the sigmoids' powers,
    then 4 eps for the products and the division."""
    ciou = 16 * FP32_EPS
    return 2 * beta * ciou + (2 * alpha + 4) * FP32_EPS


@pytest.mark.parametrize("layout", range(len(LAYOUTS)))
def test_the_assigner_gives_ultralytics_targets(compared, layout: int) -> None:
    case, ours, theirs = compared[layout]
    assigned = ours["assigned"]
    foreground = assigned.foreground
    assert foreground.any() and not foreground[1].any()  # something assigned, nothing in the empty image
    # One deliberate difference: an anchor two boxes pick, whose CIoU with every box is 0, goes to the first box row
    # there (a row that may not hold it, or be padding) and to none here. Its target score is 0 there, so neither
    # loss sees it.
    assert not (foreground & ~theirs["foreground"]).any()
    assert (theirs["scores"][theirs["foreground"] & ~foreground] == 0).all()
    # The assigned box is a gather of the same box: exact.
    assert torch.equal(assigned.boxes[foreground], theirs["boxes"][foreground])
    assert (assigned.scores - theirs["scores"]).abs().max() <= score_tolerance()


def foreground_terms(case: dict, ours: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per foreground anchor, by our own functions: its predicted and target boxes (grid units), its ``1 - CIoU``
    and its DFL term, unweighted."""
    assigned = ours["assigned"]
    flat = flatten_head_outputs(case["outputs"])
    points, stride = make_anchors([o.shape[2:] for o in case["outputs"]], case["strides"],
                                  device=torch.device("cpu"), dtype=torch.float32)
    logits = flat[..., :4 * REG_MAX][assigned.foreground]
    anchor = points.expand(len(flat), -1, -1)[assigned.foreground]
    pred = distances_to_boxes(anchor, dfl_expectation(logits, REG_MAX))
    target = (assigned.boxes / stride)[assigned.foreground]
    distances = boxes_to_distances(anchor, target, REG_MAX - 1 - 0.01)
    return pred, target, complete_iou_loss(pred, target), distribution_focal_loss(logits.view(-1, 4, REG_MAX),
                                                                                  distances)


def box_gap(pred: torch.Tensor, target: torch.Tensor) -> float:
    """The largest legitimate gap between one anchor's ``1 - CIoU`` by torchvision's form (ours) and by
    Ultralytics' ``bbox_iou``.

    The two forms differ only in where they add ``e`` = 1e-7: Ultralytics adds it to each height too, so its union
    is larger by ``e * (w1 + w2 + 1)`` (the IoU lower by up to that over the union) and its aspect angles
    ``atan(w / (h + e))`` lower by up to ``e * w / (w**2 + h**2) <= e / (2h)`` each, which moves
    ``v = 4/pi^2 * d**2`` (``|d| <= pi/2``) by up to ``4/pi`` times the angles' change; ``alpha * v`` moves by at
    most twice ``v``'s change plus the IoU's. Rounding adds a few eps (8 here: the centre distance is written in
    another order)."""
    width1, height1 = pred[:, 2] - pred[:, 0], pred[:, 3] - pred[:, 1]
    width2, height2 = target[:, 2] - target[:, 0], target[:, 3] - target[:, 1]
    inter = ((torch.minimum(pred[:, 2], target[:, 2]) - torch.maximum(pred[:, 0], target[:, 0])).clamp(0)
             * (torch.minimum(pred[:, 3], target[:, 3]) - torch.maximum(pred[:, 1], target[:, 1])).clamp(0))
    union = width1 * height1 + width2 * height2 - inter
    iou_gap = CIOU_EPS * (width1 + width2 + 1) / union
    v_gap = 4 / math.pi * CIOU_EPS * (1 / (2 * height1) + 1 / (2 * height2))
    return float((2 * iou_gap + 3 * v_gap).max()) + 8 * FP32_EPS


@pytest.mark.parametrize("layout", range(len(LAYOUTS)))
def test_each_loss_component_is_ultralytics(compared, layout: int) -> None:
    """Each part is ``gain * sum(term) / S``, ``S`` the score sum, which moves by ``n_fg * tau``
    (:func:`score_tolerance`: a foreground anchor's target may move by tau). A term moves by its sensitivity to its
    target score times tau: box and DFL terms are ``weight * term`` over the foreground, so their own size; a BCE
    term moves by ``|logit|`` per unit of target, and only the foreground's class targets differ. So a part moves by
    ``gain * tau * (sum(sensitivity) + n_fg * part / gain) / S``; then by the gaps of its terms' definitions (box:
    :func:`box_gap`, at most the largest anchor's since the weights sum to ``S``; DFL and BCE: none, the same
    functions) and by the order of its sum, ``sqrt(terms) * eps`` of itself."""
    case, ours, theirs = compared[layout]
    assigned, gains, tau = ours["assigned"], LossGains(), score_tolerance()
    count = int(assigned.foreground.sum())
    score_sum = float(assigned.scores.sum().clamp(min=1))
    pred, target, box_terms, dfl_terms = foreground_terms(case, ours)
    logits = flatten_head_outputs(case["outputs"])[..., 4 * REG_MAX:]
    class_logits = logits.gather(2, assigned.labels[..., None])[..., 0][assigned.foreground]
    terms = {"box": box_terms, "dfl": dfl_terms, "cls": class_logits.abs()}
    own = {"box": gains.box * box_gap(pred, target), "dfl": 0.0, "cls": 0.0}
    sizes = {"box": count, "dfl": 4 * count, "cls": logits.numel()}
    for index, name in enumerate(("box", "cls", "dfl")):
        gain, got, expected = getattr(gains, name), float(ours["parts"][name]), float(theirs["loss"][index])
        bound = gain * tau * (float(terms[name].sum()) + count * got / gain) / score_sum + own[name]
        bound += math.sqrt(sizes[name]) * FP32_EPS * expected
        assert abs(got - expected) <= bound, (name, got, expected, bound)


# The child: Ultralytics' cls_pw weights (DetectionTrainer.compute_class_weights, then set_class_weights' division by
# the mean) for each (counts, power).
WEIGHTS_ORACLE = """
import sys, types
import numpy as np
import torch
from ultralytics.models.yolo.detect.train import DetectionTrainer

results = []
for counts, power in torch.load(sys.argv[1]):
    trainer = types.SimpleNamespace(args=types.SimpleNamespace(cls_pw=power))
    weights = DetectionTrainer.compute_class_weights(trainer, counts.numpy().astype(np.float32))
    results.append(torch.from_numpy(weights / weights.mean()))
torch.save(results, sys.argv[2])
"""


def test_class_weights_are_ultralytics(tmp_path) -> None:
    """``--cls-pw``'s weights equal Ultralytics' ``cls_pw`` ones: inverse frequency to the power, a class without
    boxes at the others' mean, a mean of 1. Theirs are FP32 NumPy, ours FP64 rounded once to FP32: a few FP32
    rounding steps apart (the power, the division, the mean), 8 eps of the weight at most."""
    if importlib.util.find_spec("ultralytics") is None:  # looked for, not imported (see above)
        pytest.skip("ultralytics (the dev extra) is not installed")
    cases = [(torch.tensor([10, 40, 0, 5, 1000]), power) for power in (1.0, 0.5, 0.25)]
    cases.append((torch.tensor([3, 3, 3]), 1.0))  # balanced: all ones
    torch.save(cases, tmp_path / "cases.pt")
    env = {**os.environ, "YOLO_OFFLINE": "1", "YOLO_CONFIG_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", WEIGHTS_ORACLE, str(tmp_path / "cases.pt"),
                             str(tmp_path / "theirs.pt")], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    for (counts, power), theirs in zip(cases, torch.load(tmp_path / "theirs.pt")):
        ours = frequency_weights(counts, power)
        torch.testing.assert_close(ours, theirs.float(), rtol=8 * FP32_EPS, atol=0)
