"""Exported model vs the FP32 PyTorch model on the same images: largest differences, and mAP on a dataset.

Raw graphs (``boxes``, ``scores``) are compared anchor by anchor. Graphs with NMS inside are compared
detection by detection against our Python NMS run with the same baked thresholds: each exported box is
matched to the reference box of the same class with the highest IoU (> 0.5); boxes without a partner on
the other side are counted as ``unmatched``.

Whatever the graph, the detections both sides are sure of must agree: a detection scored at least ``score_tolerance``
above the confidence threshold (:data:`CONFIDENT` for raw graphs, the baked one with NMS inside) needs a partner of its
class with IoU > 0.5 on the other side, which both sides look for down to ``score_tolerance`` below the threshold (so
that a score the tolerance allows to move cannot cross it). Precision moves boxes by a pixel at most, far inside that
IoU; a broken decode, wrong labels or an NMS graph that returns nothing do not pass. Without a dataset the check has
only the images it is given: where the PyTorch model is sure of nothing on them, the summary says the boxes went
unchecked.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np
import torch

from detector.boxes import box_iou
from detector.data.build import SplitData
from detector.data.synthetic import make_image
from detector.defaults import SCORE_TOLERANCE
from detector.inference.backend import Backend
from detector.inference.preprocess import Detections, prepare_batch
from detector.metrics.loop import make_val_loader, run_validation
from detector.postprocess import NMSConfig

EVAL_NMS = NMSConfig(conf_threshold=0.001, iou_threshold=0.7, max_detections=300, multi_label=True)
CONFIDENT = 0.25  # box differences are also reported over anchors the reference scores above this
MATCH_IOU = 0.5


@dataclass
class ParityReport:
    """Differences exported - reference; mAP50-95 in points (0-100), ``None`` without a dataset."""

    name: str
    images: int
    max_box_diff: float = 0.0  # pixels, largest |coordinate| difference
    max_box_diff_confident: float | None = None  # the same over anchors scored > CONFIDENT (raw graphs)
    max_score_diff: float = 0.0
    unmatched: int = 0  # NMS graphs only
    sure: int = 0  # detections the reference scored above the threshold by the tolerance (see the module's doc)
    lost: int = 0  # detections so scored, on either side, with no partner on the other
    sure_floor: float = CONFIDENT
    map_reference: float | None = None
    map_exported: float | None = None
    map_images: int = 0
    nms: NMSConfig = EVAL_NMS  # thresholds both sides were post-processed with
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        line = f"parity {self.name} vs pytorch fp32 on {self.images} images: max box diff {self.max_box_diff:.4g} px"
        if self.max_box_diff_confident is not None:
            line += f" ({self.max_box_diff_confident:.4g} px where score > {CONFIDENT})"
        line += f", max score diff {self.max_score_diff:.4g}"
        line += f", unmatched detections {self.unmatched}" if self.unmatched else ""
        lines = [line + (f"; {self.sure} detections above {self.sure_floor:.2f}, each with its partner" if self.sure
                         and not self.lost else "")]
        if self.sure == 0 and not self.failures:
            # The mAP comparison follows when --data was given; without it, the note says how to get one.
            hint = "" if self.map_reference is not None else " (--data compares mAP on the dataset's val images)"
            lines.append(f"note: the PyTorch model scores no detection above {self.sure_floor:.2f} on these images, so "
                         f"no box was compared{hint}")
        if self.map_reference is not None and self.map_exported is not None:
            lines.append(
                f"mAP50-95 on {self.map_images} val images ({postprocess_words(self.nms)}): pytorch fp32 "
                f"{self.map_reference:.2f}, {self.name} "
                f"{self.map_exported:.2f} (change {self.map_exported - self.map_reference:+.2f} points)"
            )
        lines += [f"parity FAILED: {failure}" for failure in self.failures]
        return "\n".join(lines)


def postprocess_words(nms: NMSConfig) -> str:
    """How both sides were postprocessed, in words for the summary."""
    if nms.end_to_end:
        return f"NMS-free top-{nms.max_detections} above conf {nms.conf_threshold}"
    return f"NMS conf {nms.conf_threshold}, IoU {nms.iou_threshold}"


def synthetic_images(size: int, count: int = 4, seed: int = 0) -> torch.Tensor:
    """Deterministic shapes images, letterboxed: uint8 ``[count, 3, size, size]``."""
    rng = np.random.default_rng(seed)
    images = [make_image(rng, size)[0] for _ in range(count)]
    return prepare_batch(images, size)[0]


def split_images(split: SplitData, count: int = 8) -> torch.Tensor:
    """The first ``count`` letterboxed validation images, uint8 ``[count, 3, S, S]``."""
    return torch.stack([split.dataset[index][0] for index in range(min(count, len(split.dataset)))])


def match_detections(reference: Detections, exported: Detections) -> tuple[float, float, int]:
    """-> (max box diff px, max score diff, unmatched count) over same-class pairs with IoU > 0.5."""
    box_diff = score_diff = 0.0
    unmatched = 0
    for ref, exp in zip(reference, exported):
        if len(ref["boxes"]) == 0 or len(exp["boxes"]) == 0:
            unmatched += len(ref["boxes"]) + len(exp["boxes"])
            continue
        iou = box_iou(exp["boxes"].float(), ref["boxes"].float())
        iou[exp["labels"][:, None] != ref["labels"][None, :]] = -1
        best_iou, partner = iou.max(1)
        matched = best_iou > MATCH_IOU
        unmatched += int((~matched).sum()) + len(ref["boxes"]) - len(partner[matched].unique())
        if matched.any():
            pairs = partner[matched]
            box_diff = max(box_diff, float((exp["boxes"][matched] - ref["boxes"][pairs]).abs().max()))
            score_diff = max(score_diff, float((exp["scores"][matched] - ref["scores"][pairs]).abs().max()))
    return box_diff, score_diff, unmatched


def unpartnered(side: Detections, other: Detections, floor: float) -> tuple[int, int]:
    """-> (detections of ``side`` scored ``>= floor``, how many of them have no same-class partner with
    IoU > :data:`MATCH_IOU` in ``other``)."""
    sure = lost = 0
    for mine, theirs in zip(side, other):
        keep = mine["scores"] >= floor
        sure += int(keep.sum())
        if not keep.any():
            continue
        if len(theirs["boxes"]) == 0:
            lost += int(keep.sum())
            continue
        iou = box_iou(mine["boxes"][keep].float(), theirs["boxes"].float())
        iou[mine["labels"][keep][:, None] != theirs["labels"][None, :]] = -1
        lost += int((iou.amax(1) <= MATCH_IOU).sum())
    return sure, lost


def compare_on_images(reference: Backend, exported: Backend, images: torch.Tensor, report: ParityReport,
                      batch: int = 8, score_tolerance: float = SCORE_TOLERANCE) -> None:
    """Fill the difference fields of ``report`` (and flag non-finite outputs)."""
    threshold = exported.info.nms.conf_threshold if exported.info.nms is not None else CONFIDENT
    report.sure_floor = threshold + score_tolerance
    # Raw graphs: both sides' detections down to the tolerance below the threshold (a graph with NMS inside has
    # only its own threshold's; a score near it that moves across is not counted: only those above the floor are).
    wide = NMSConfig(conf_threshold=max(threshold - score_tolerance, 1e-3), iou_threshold=EVAL_NMS.iou_threshold,
                     max_detections=EVAL_NMS.max_detections)
    for start in range(0, len(images), batch):
        chunk = images[start : start + batch]
        # On CPU: a TensorRT engine answers on the GPU while the reference may run on the CPU.
        ref_raw = tuple(tensor.cpu() for tensor in reference.infer(chunk))
        exp_raw = tuple(tensor.cpu() for tensor in exported.infer(chunk))
        if not all(torch.isfinite(tensor.float()).all() for tensor in exp_raw):
            report.failures.append("the exported model produced NaN or infinite outputs")
            return
        if exported.info.nms is None:
            anchor_diff = (exp_raw[0] - ref_raw[0]).abs().amax(-1)  # [B, A] px
            box_diff = float(anchor_diff.max())
            score_diff = float((exp_raw[1].float() - ref_raw[1]).abs().max())
            unmatched = 0
            confident = ref_raw[1].amax(-1) > CONFIDENT
            if confident.any():
                previous = report.max_box_diff_confident or 0.0
                report.max_box_diff_confident = max(previous, float(anchor_diff[confident].max()))
            pairs = reference.postprocess(ref_raw, nms=wide), exported.postprocess(exp_raw, nms=wide)
        else:
            pairs = reference.postprocess(ref_raw), exported.postprocess(exp_raw)
            box_diff, score_diff, unmatched = match_detections(*pairs)
        sure, lost = unpartnered(pairs[0], pairs[1], report.sure_floor)
        report.sure += sure
        report.lost += lost + unpartnered(pairs[1], pairs[0], report.sure_floor)[1]
        report.max_box_diff = max(report.max_box_diff, box_diff)
        report.max_score_diff = max(report.max_score_diff, score_diff)
        report.unmatched += unmatched


def map50_95(backend: Backend, split: SplitData, *, batch_size: int, workers: int) -> float:
    loader = make_val_loader(split, batch_size=batch_size, workers=workers)
    return 100 * run_validation(backend, split, loader, progress=False).metrics["mAP50-95"]


def check_parity(
    reference: Backend, exported: Backend, *, images: torch.Tensor, split: SplitData | None = None,
    map_margin: float = 0.5, score_tolerance: float = SCORE_TOLERANCE, batch_size: int = 8, workers: int = 2,
) -> ParityReport:
    """Compare ``exported`` with the FP32 PyTorch ``reference`` on ``images`` (uint8 ``[N, 3, S, S]``).

    With ``split``, also score both with the COCO evaluator ``val`` uses and fail when the exported mAP50-95 is
    more than ``map_margin`` points lower; without it, fail when a score differs by more than ``score_tolerance``.
    Sets both backends' NMS to the evaluation thresholds (conf 0.001, IoU 0.7, 300, multi-label), or to
    the exported graph's own thresholds when it has NMS inside, so both sides are judged alike. An end-to-end export
    (YOLO26's one-to-one head) is compared with a reference in that branch, both postprocessed by the NMS-free top-k
    (``ValueError`` for a reference in the other branch).
    """
    if reference.info.end_to_end != exported.info.end_to_end:  # one branch's boxes against the other's
        branch = {True: "the one-to-one (end-to-end) head", False: "the usual head"}
        raise ValueError(f"parity: {exported.name} runs {branch[exported.info.end_to_end]}, the reference "
                         f"{branch[reference.info.end_to_end]}: give the reference the same one")
    reference.nms = exported.nms = exported.info.nms or dataclasses.replace(EVAL_NMS,
                                                                            end_to_end=exported.info.end_to_end)
    report = ParityReport(exported.name, images=len(images), nms=reference.nms)
    compare_on_images(reference, exported, images, report, batch=batch_size, score_tolerance=score_tolerance)
    report.name = exported.name  # again: a backend may say only once it has run how it ran (pt2: "cuda graph")
    if report.failures:
        return report
    if report.lost:
        report.failures.append(
            f"{report.lost} detection(s) scored above {report.sure_floor:.2f} on one side have no partner of their "
            f"class with IoU > {MATCH_IOU} on the other (boxes or labels differ)")
    if split is not None:
        report.map_images = len(split.records)
        report.map_reference = map50_95(reference, split, batch_size=batch_size, workers=workers)
        report.map_exported = map50_95(exported, split, batch_size=batch_size, workers=workers)
        drop = report.map_reference - report.map_exported
        if not math.isfinite(drop) or drop > map_margin:
            report.failures.append(f"mAP50-95 fell by {drop:.2f} points, more than --map-margin {map_margin}")
    elif report.max_score_diff > score_tolerance:
        drift = report.max_score_diff
        report.failures.append(f"a score differs by {drift:.3g}, more than --score-tol {score_tolerance}")
    report.name = exported.name  # and after the mAP pass, whose new batch shapes may have made it fall back
    return report
