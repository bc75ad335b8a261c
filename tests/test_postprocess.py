"""Batched NMS: the same detections as NMS run image by image (the implementation it replaced)."""

from __future__ import annotations

import pytest
import torch
from torchvision.ops import batched_nms

from detector.postprocess import NMSConfig, non_max_suppression


def per_image_nms(decoded: torch.Tensor, config: NMSConfig) -> list[dict[str, torch.Tensor]]:
    """The reference: one candidate selection, top-k and ``batched_nms`` per image."""
    results = []
    for image_preds in decoded:
        boxes, class_scores = image_preds[:, :4], image_preds[:, 4:]
        if config.multi_label:
            anchor_idx, labels = (class_scores > config.conf_threshold).nonzero(as_tuple=True)
            scores, boxes = class_scores[anchor_idx, labels], boxes[anchor_idx]
        else:
            scores, labels = class_scores.max(1)
            keep = scores > config.conf_threshold
            boxes, scores, labels = boxes[keep], scores[keep], labels[keep]
        if scores.numel() > config.max_candidates:
            top = scores.topk(config.max_candidates).indices
            boxes, scores, labels = boxes[top], scores[top], labels[top]
        keep = batched_nms(boxes, scores, labels, config.iou_threshold)[: config.max_detections]
        results.append({"boxes": boxes[keep], "scores": scores[keep], "labels": labels[keep]})
    return results


def random_decoded(batch: int, anchors: int, classes: int, *, seed: int) -> torch.Tensor:
    """Clustered boxes (so NMS suppresses) with distinct random scores (so no order depends on ties)."""
    generator = torch.Generator().manual_seed(seed)
    centres = torch.rand(batch, anchors, 2, generator=generator) * 100
    sizes = torch.rand(batch, anchors, 2, generator=generator) * 30 + 5
    boxes = torch.cat((centres - sizes / 2, centres + sizes / 2), -1)
    scores = torch.rand(batch, anchors, classes, generator=generator) ** 3
    return torch.cat((boxes, scores), -1)


@pytest.mark.parametrize("multi_label", [True, False])
@pytest.mark.parametrize(
    "conf, max_candidates, max_detections", [(0.001, 30000, 300), (0.25, 30000, 300), (0.001, 50, 300), (0.001, 30000, 7)]
)
def test_batched_nms_equals_per_image(multi_label, conf, max_candidates, max_detections):
    decoded = random_decoded(4, 400, 3, seed=0)
    decoded[2, :, 4:] = 0.0  # an image with no candidate at all
    config = NMSConfig(conf_threshold=conf, iou_threshold=0.7, max_detections=max_detections,
                       max_candidates=max_candidates, multi_label=multi_label)
    ours, reference = non_max_suppression(decoded, config), per_image_nms(decoded, config)
    assert len(ours) == len(reference) == 4
    assert len(ours[2]["scores"]) == 0
    for got, want in zip(ours, reference):
        for key in ("boxes", "scores", "labels"):
            assert torch.equal(got[key], want[key]), key
        assert len(got["scores"]) <= max_detections


def test_empty_batch_gives_empty_detections():
    decoded = torch.zeros(2, 10, 4 + 3)
    out = non_max_suppression(decoded, NMSConfig(conf_threshold=0.5, multi_label=True))
    assert [len(d["scores"]) for d in out] == [0, 0]
    assert out[0]["boxes"].shape == (0, 4)
