import math

import torch
import torchvision.ops

from detector.boxes import (
    box_iou,
    boxes_to_distances,
    complete_iou_pairs,
    cxcywh_to_xyxy,
    dfl_expectation,
    distances_to_boxes,
    flatten_head_outputs,
    make_anchors,
    xyxy_to_cxcywh,
)


def test_xyxy_cxcywh_round_trip():
    boxes = torch.tensor([[10.0, 20.0, 50.0, 80.0], [0.0, 0.0, 1.0, 2.0]])
    assert torch.allclose(cxcywh_to_xyxy(xyxy_to_cxcywh(boxes)), boxes)
    assert torch.allclose(xyxy_to_cxcywh(boxes)[0], torch.tensor([30.0, 50.0, 40.0, 60.0]))


def test_distances_round_trip_inside_range():
    points = torch.tensor([[5.0, 5.0], [2.5, 7.5]])
    boxes = torch.tensor([[1.0, 2.0, 9.0, 8.0], [0.5, 3.0, 4.0, 10.0]])
    distances = boxes_to_distances(points, boxes, max_distance=15)
    assert torch.allclose(distances_to_boxes(points, distances), boxes)


def test_distances_are_clamped_to_bin_range():
    distances = boxes_to_distances(torch.tensor([[0.5, 0.5]]), torch.tensor([[0.0, 0.0, 40.0, 40.0]]), max_distance=14.99)
    assert distances.max() <= 14.99


def test_anchor_layout_and_strides():
    points, strides = make_anchors([(4, 6), (2, 3)], (8, 16), device=torch.device("cpu"), dtype=torch.float32)
    assert points.shape == (24 + 6, 2) and strides.shape == (30, 1)
    assert torch.equal(points[0], torch.tensor([0.5, 0.5])) and torch.equal(points[1], torch.tensor([1.5, 0.5]))
    assert strides[:24].eq(8).all() and strides[24:].eq(16).all()


def test_dfl_expectation_of_one_hot_logits_is_the_bin():
    logits = torch.full((1, 4 * 16), -1e4)
    for side, bin_index in enumerate((0, 3, 7, 15)):
        logits[0, side * 16 + bin_index] = 1e4
    assert torch.allclose(dfl_expectation(logits, 16), torch.tensor([[0.0, 3.0, 7.0, 15.0]]))


def test_flattened_head_is_contiguous_anchor_major_in_either_layout():
    maps = [torch.randn(2, 7, 4, 4), torch.randn(2, 7, 2, 2)]
    expected = torch.cat([m.flatten(2) for m in maps], 2).transpose(1, 2)  # [B, A, C], level by level
    for layout in (torch.contiguous_format, torch.channels_last):
        flat = flatten_head_outputs([m.contiguous(memory_format=layout) for m in maps])
        assert flat.shape == (2, 20, 7) and flat.is_contiguous()
        assert torch.equal(flat, expected)


def random_boxes(count: int, *, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    corners = torch.rand(count, 2, generator=generator) * 200
    return torch.cat((corners, corners + torch.rand(count, 2, generator=generator) * 40 + 1), 1)


def test_box_iou_is_torchvisions_to_the_bit_and_batches():
    first, second = random_boxes(50, seed=3), random_boxes(70, seed=4)
    assert torch.equal(box_iou(first, second), torchvision.ops.box_iou(first, second))
    stacked = box_iou(torch.stack((first, first.flip(0))), torch.stack((second, second.flip(0))))
    assert torch.equal(stacked[0], box_iou(first, second))
    assert torch.equal(stacked[1], box_iou(first.flip(0), second.flip(0)))
    empty = torch.tensor([[5.0, 5.0, 5.0, 9.0]])  # no area: 0/0 without eps, 0 with it
    assert torch.isnan(box_iou(empty, empty)).all() and box_iou(empty, empty, eps=1e-9).item() == 0.0


def test_complete_iou_pairs_are_torchvisions_ciou_up_to_where_eps_is_added_and_batch():
    """Against ``1 - complete_box_iou_loss`` pair by pair (tests/test_loss_oracle.py compares the definition with
    Ultralytics' itself). The forms differ only where ``e`` = 1e-7 goes: ours adds it to each height too, which
    lowers the IoU by up to ``e * (w1 + w2 + 1) / union`` and each aspect angle by up to ``e / (2h)``, moving
    ``v`` by ``4/pi`` times that and ``alpha * v`` by twice ``v``'s change plus the IoU's; rounding adds a few eps
    (8: the centre distance written in another order)."""
    first, second = random_boxes(30, seed=5), random_boxes(40, seed=6)
    pairs = complete_iou_pairs(first, second)
    a, b = first[:, None].expand(-1, 40, -1).reshape(-1, 4), second[None].expand(30, -1, -1).reshape(-1, 4)
    reference = (1 - torchvision.ops.complete_box_iou_loss(a, b, reduction="none")).view(30, 40)
    width1, height1 = (a[:, 2] - a[:, 0]).view(30, 40), (a[:, 3] - a[:, 1]).view(30, 40)
    width2, height2 = (b[:, 2] - b[:, 0]).view(30, 40), (b[:, 3] - b[:, 1]).view(30, 40)
    union_at_least = (width1 * height1 + width2 * height2) / 2  # the larger area
    iou_gap = 1e-7 * (width1 + width2 + 1) / union_at_least
    bound = 2 * iou_gap + 3 * 4 / math.pi * 1e-7 * (1 / (2 * height1) + 1 / (2 * height2))
    assert ((pairs - reference).abs() <= bound + 8 * torch.finfo(torch.float32).eps).all()
    assert (pairs < 0).any() and (pairs > 0.3).any()  # apart and overlapping pairs both
    stacked = complete_iou_pairs(torch.stack((first, first.flip(0))), torch.stack((second, second.flip(0))))
    assert torch.equal(stacked[0], pairs) and torch.equal(stacked[1], complete_iou_pairs(first.flip(0), second.flip(0)))
