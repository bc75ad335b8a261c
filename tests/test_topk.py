"""The NMS-free top-k (detector/topk.py) against a brute-force reference and against Ultralytics' own end-to-end
postprocess (in a child process: importing Ultralytics patches this one for good)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from detector.postprocess import NMSConfig, batched_non_max_suppression, non_max_suppression
from detector.topk import top_k_detections


def brute_force(image: torch.Tensor, conf: float, max_det: int, agnostic: bool) -> list[tuple[int, int]]:
    """One image's ``[A, 4 + C]`` -> the kept (anchor, class) pairs, in order, by the rule written out: every pair
    of a finite box scored above ``conf`` (with ``agnostic``, each anchor's first best class alone), ordered by
    score descending, then by anchor x C + class, the first ``min(max_det, A)``."""
    anchors, classes = image.shape[0], image.shape[1] - 4
    pairs = []
    for anchor in range(anchors):
        if not all(float(value) == float(value) and abs(float(value)) != float("inf") for value in image[anchor, :4]):
            continue
        scores = image[anchor, 4:].tolist()
        chosen = [scores.index(max(scores))] if agnostic else range(classes)
        pairs += [(-scores[label], anchor * classes + label, anchor, label) for label in chosen if scores[label] > conf]
    return [(anchor, label) for _, _, anchor, label in sorted(pairs)[: min(max_det, anchors)]]


def random_decoded(seed: int, batch: int = 3, anchors: int = 60, classes: int = 4) -> torch.Tensor:
    """``[B, A, 4 + C]`` with scores on a 0.05 grid (many exact ties, to exercise the order), a NaN and an infinite
    box, and one image with no score above 0.5."""
    generator = torch.Generator().manual_seed(seed)
    decoded = torch.rand(batch, anchors, 4 + classes, generator=generator) * 100
    decoded[..., 4:] = (torch.rand(batch, anchors, classes, generator=generator) * 20).round() / 20
    decoded[0, 3, 1] = float("nan")
    decoded[1, 7, 2] = float("inf")
    decoded[2, :, 4:] *= 0.5
    return decoded


@pytest.mark.parametrize("agnostic", [False, True], ids=["per-pair", "agnostic"])
@pytest.mark.parametrize("max_det", [1, 25, 300], ids=lambda k: f"max_det={k}")
def test_the_top_k_is_the_brute_force_rule_on_every_path(agnostic: bool, max_det: int) -> None:
    decoded = random_decoded(seed=max_det)
    config = NMSConfig(conf_threshold=0.5, max_detections=max_det, agnostic=agnostic, end_to_end=True)
    results = {"cpu path": non_max_suppression(decoded, config),
               "batched path": batched_non_max_suppression(decoded, config),
               "per image": [non_max_suppression(image[None], config)[0] for image in decoded]}
    for image_index, image in enumerate(decoded):
        expected = brute_force(image, 0.5, max_det, agnostic)
        anchors = [anchor for anchor, _ in expected]
        for name, result in results.items():
            kept = result[image_index]
            where = f"{name}, image {image_index}"
            assert kept["labels"].tolist() == [label for _, label in expected], where
            assert torch.equal(kept["boxes"], image[anchors, :4]), where  # the very values: no arithmetic on them
            assert torch.equal(kept["scores"], image[anchors, 4 + kept["labels"]]), where
            assert kept["labels"].dtype == torch.int64, where
    # Each case was exercised: the last image kept nothing; max_det bit below the anchors, and the cap at the anchors
    # (A = 60 < 300) bit where pairs above conf outnumber them; ties (the 0.05 grid) were ordered.
    assert len(results["cpu path"][2]["scores"]) == 0
    counts = [len(result["scores"]) for result in results["cpu path"]]
    assert max(counts) == max_det if max_det < 60 else (agnostic or max(counts) == 60)
    first = results["cpu path"][0]["scores"]
    assert len(first) < 2 or bool((first[1:] == first[:-1]).any())


def test_one_pair_per_anchor_unless_agnostic_says_so_and_no_suppression() -> None:
    # Two identical boxes, each with two classes above conf: NMS would keep one box a class; the top-k keeps all
    # (two more anchors, scored 0, so that its cap of one pair per anchor, min(max_det, anchors), does not bite).
    decoded = torch.tensor([[[0.0, 0.0, 10.0, 10.0, 0.9, 0.8], [0.0, 0.0, 10.0, 10.0, 0.7, 0.6],
                             [0.0, 0.0, 5.0, 5.0, 0.0, 0.0], [0.0, 0.0, 5.0, 5.0, 0.0, 0.0]]])
    plain = non_max_suppression(decoded, NMSConfig(conf_threshold=0.1, end_to_end=True))[0]
    assert plain["scores"].tolist() == pytest.approx([0.9, 0.8, 0.7, 0.6]) and plain["labels"].tolist() == [0, 1, 0, 1]
    agnostic = non_max_suppression(decoded, NMSConfig(conf_threshold=0.1, agnostic=True, end_to_end=True))[0]
    assert agnostic["scores"].tolist() == pytest.approx([0.9, 0.7]) and agnostic["labels"].tolist() == [0, 0]
    nothing = top_k_detections(decoded[:, :0], conf_threshold=0.1, max_detections=5)  # no anchors at all
    assert nothing[0]["boxes"].shape == (0, 4) and nothing[0]["labels"].dtype == torch.int64


# The child: Ultralytics' own end-to-end postprocess (Detect.postprocess's two-stage top-k, then the end2end branch
# of non_max_suppression) on the saved case; -> per image rows (x1, y1, x2, y2, score, class).
ORACLE = """
import sys
import torch
from ultralytics.nn.modules.head import Detect
from ultralytics.utils.nms import non_max_suppression

results = []
for case in torch.load(sys.argv[1]):
    head = Detect(nc=case["decoded"].shape[-1] - 4, ch=(16,))
    head.max_det, head.agnostic_nms = case["max_det"], case["agnostic"]
    rows = head.postprocess(case["decoded"])
    results.append(non_max_suppression(rows, conf_thres=case["conf"], max_det=case["max_det"], end2end=True))
torch.save(results, sys.argv[2])
"""


@pytest.mark.skipif(importlib.util.find_spec("ultralytics") is None, reason="the oracle needs the dev extra")
def test_the_top_k_is_ultralytics_nms_free_postprocess(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(1)
    # Continuous scores (no ties, whose order Ultralytics leaves to topk) over 120 anchors x 5 classes, at conf 0.3:
    # max_det 50 below the anchors (its two-stage top-k then chooses among anchors), and 300 above them (its cap).
    decoded = torch.rand(2, 120, 9, generator=generator) * 64
    cases = [{"decoded": decoded, "max_det": max_det, "agnostic": agnostic, "conf": 0.3}
             for agnostic in (False, True) for max_det in (50, 300)]
    torch.save(cases, tmp_path / "cases.pt")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "YOLO_OFFLINE": "1", "YOLO_CONFIG_DIR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", ORACLE, str(tmp_path / "cases.pt"), str(tmp_path / "out.pt")],
                   check=True, timeout=120, env=env, cwd=tmp_path, capture_output=True)
    for case, theirs in zip(cases, torch.load(tmp_path / "out.pt")):
        config = NMSConfig(conf_threshold=0.3, max_detections=case["max_det"], agnostic=case["agnostic"],
                           end_to_end=True)
        for mine, rows in zip(non_max_suppression(decoded, config), theirs):
            assert len(rows) == len(mine["scores"]) > 0, case
            # Both gather the same FP32 values (no arithmetic on them), so they are equal exactly.
            assert torch.equal(rows[:, :4], mine["boxes"]) and torch.equal(rows[:, 4], mine["scores"]), case
            assert rows[:, 5].long().tolist() == mine["labels"].tolist(), case
