import torch
from detector.assigner import AssignerConfig, assign_targets


def _inputs(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    anchors = torch.stack(torch.meshgrid(torch.arange(8) * 8 + 4.0, torch.arange(8) * 8 + 4.0, indexing="xy"), -1).view(-1, 2)
    logits = torch.randn(2, 64, 3, generator=generator)
    centres = anchors[None].expand(2, -1, -1)
    pred_boxes = torch.cat((centres - 6 - torch.rand(2, 64, 2, generator=generator) * 4,
                            centres + 6 + torch.rand(2, 64, 2, generator=generator) * 4), -1)
    gt_boxes = torch.tensor([[[2.0, 2.0, 30.0, 30.0], [30.0, 10.0, 60.0, 40.0], [0, 0, 0, 0]],
                             [[10.0, 20.0, 50.0, 60.0], [0, 0, 0, 0], [0, 0, 0, 0]]])
    gt_labels = torch.tensor([[0, 2, 0], [1, 0, 0]])
    gt_mask = torch.tensor([[True, True, False], [True, False, False]])
    return logits, pred_boxes, anchors, gt_labels, gt_boxes, gt_mask


def test_batched_equals_per_image():
    logits, pred_boxes, anchors, labels, boxes, mask = _inputs()
    batched = assign_targets(logits, pred_boxes, anchors, labels, boxes, mask, num_classes=3)
    for i in range(2):
        real = int(mask[i].sum())  # per image, without the padding rows
        single = assign_targets(logits[i:i + 1], pred_boxes[i:i + 1], anchors, labels[i:i + 1, :real],
                                boxes[i:i + 1, :real], mask[i:i + 1, :real], num_classes=3)
        assert torch.equal(single.foreground[0], batched.foreground[i])
        assert torch.allclose(single.scores[0], batched.scores[i])
        assert torch.allclose(single.boxes[0][single.foreground[0]], batched.boxes[i][batched.foreground[i]])


def test_positives_lie_inside_their_box_and_respect_top_k():
    logits, pred_boxes, anchors, labels, boxes, mask = _inputs()
    result = assign_targets(logits, pred_boxes, anchors, labels, boxes, mask, num_classes=3,
                            config=AssignerConfig(top_k=5))
    assert result.foreground.any()
    for b in range(2):
        fg = result.foreground[b]
        points, assigned = anchors[fg], result.boxes[b][fg]
        assert ((points > assigned[:, :2]) & (points < assigned[:, 2:])).all()
        assert fg.sum() <= 5 * int(mask[b].sum())
        assert torch.equal(result.scores[b][~fg], torch.zeros_like(result.scores[b][~fg]))


def test_empty_targets_give_no_foreground():
    logits, pred_boxes, anchors, *_ = _inputs()
    result = assign_targets(logits, pred_boxes, anchors, torch.zeros(2, 0, dtype=torch.long), torch.zeros(2, 0, 4),
                            torch.zeros(2, 0, dtype=torch.bool), num_classes=3)
    assert not result.foreground.any() and result.scores.sum() == 0


def test_anchor_claimed_by_two_boxes_keeps_the_one_it_overlaps_most():
    anchors = torch.tensor([[16.0, 16.0], [48.0, 48.0]])
    pred_boxes = torch.tensor([[[4.0, 4.0, 28.0, 28.0], [40.0, 40.0, 56.0, 56.0]]])
    # Both boxes contain anchor 0; the second (index 1) matches its prediction far better.
    gt_boxes = torch.tensor([[[0.0, 0.0, 60.0, 60.0], [5.0, 5.0, 27.0, 27.0]]])
    result = assign_targets(torch.zeros(1, 2, 2), pred_boxes, anchors, torch.tensor([[0, 1]]), gt_boxes,
                            torch.tensor([[True, True]]), num_classes=2, config=AssignerConfig(top_k=2))
    assert result.foreground[0].tolist() == [True, True]
    assert result.labels[0].tolist() == [1, 0]  # anchor 0 -> box 1 (higher IoU); anchor 1 only in box 0
    assert torch.equal(result.boxes[0, 0], gt_boxes[0, 1])


def test_candidates_from_bool_comparisons_equal_the_min_distance_rule():
    from detector.assigner import EPS, candidate_anchors

    generator = torch.Generator().manual_seed(5)
    anchors = torch.stack(torch.meshgrid(torch.arange(16) * 4 + 2.0, torch.arange(16) * 4 + 2.0, indexing="xy"),
                          -1).view(-1, 2)
    corners = torch.rand(3, 7, 2, generator=generator) * 50
    boxes = torch.cat((corners, corners + torch.rand(3, 7, 2, generator=generator) * 30), -1)
    boxes[0, 0] = torch.tensor([2.0, 2.0, 10.0, 10.0])  # anchors exactly on the edges: not inside
    mask = torch.rand(3, 7, generator=generator) < 0.8
    x, y = anchors[:, 0], anchors[:, 1]
    gx1, gy1, gx2, gy2 = (boxes[..., i, None] for i in range(4))
    # The rule as it was written before: the smallest of the four distances, over a float [B, M, A, 4] stack.
    expected = (torch.stack((x - gx1, y - gy1, gx2 - x, gy2 - y), -1).amin(-1) > EPS) & mask[..., None]
    found = candidate_anchors(anchors, boxes, mask)
    assert found.dtype == torch.bool and torch.equal(found, expected) and found.any()


def test_extra_padding_rows_change_no_assignment():
    logits, pred_boxes, anchors, labels, boxes, mask = _inputs()
    tight = assign_targets(logits, pred_boxes, anchors, labels, boxes, mask, num_classes=3)
    extra = 13  # padding rows as the captured step's fixed box count adds them: zeros, masked out
    padded = assign_targets(logits, pred_boxes, anchors,
                            torch.cat((labels, torch.zeros(2, extra, dtype=torch.long)), 1),
                            torch.cat((boxes, torch.zeros(2, extra, 4)), 1),
                            torch.cat((mask, torch.zeros(2, extra, dtype=torch.bool)), 1), num_classes=3)
    for name in ("labels", "boxes", "scores", "foreground"):  # bit for bit: padding only adds masked zeros
        assert torch.equal(getattr(tight, name), getattr(padded, name)), name


def test_the_alignment_takes_the_sigmoid_of_each_box_class_logit_only():
    """The same alignment as the sigmoid of every logit gathered after (the form before), and no ``[B, A, C]``
    tensor made but the class targets: the probabilities of every class were one more at the loss's peak memory
    (172 MB for COCO at batch 64, 640 px)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from detector.assigner import alignment_metric, candidate_anchors

    logits, pred_boxes, anchors, labels, boxes, mask = _inputs()
    logits = torch.cat((logits, logits * 3), -1)  # 6 classes: no other dimension of the inputs is 6
    candidates = candidate_anchors(anchors, boxes, mask)
    alignment, iou = alignment_metric(logits, pred_boxes, labels, boxes, candidates, alpha=0.5, beta=6.0)
    scores = logits.sigmoid().gather(2, labels[:, None, :].expand(-1, 64, -1)).transpose(1, 2)
    expected = scores.pow(0.5) * iou.pow(6.0) * candidates
    assert candidates.any() and expected.amax() > 0
    # The sigmoid of one element is the same function either way; the CPU computes it with a vectorised exp or,
    # in a loop's tail, the C library's, which may differ in the last bit of FP32 (2**-23 relative). The square
    # root halves that, the IoU factor is the same tensor: 1e-6 relative bounds a few last-bit differences.
    torch.testing.assert_close(alignment, expected, rtol=1e-6, atol=0)

    class Made(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.shapes: list[tuple[str, tuple[int, ...]]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            if isinstance(out, torch.Tensor) and not name.endswith("_"):  # out of place: a new tensor
                self.shapes.append((name, tuple(out.shape)))
            return out

    with Made() as made:
        result = assign_targets(logits, pred_boxes, anchors, labels, boxes, mask, num_classes=6)
    assert result.foreground.any()
    per_class = [name for name, shape in made.shapes if shape == (2, 64, 6)]
    assert len(per_class) == 1, per_class  # the class targets, filled in place


def test_a_box_narrower_than_the_second_stride_is_widened_to_find_its_anchors():
    """A 6-px box between four anchor centres (stride 8: centres at 4, 12, ...) holds none of them; widened to 16 px
    about its centre, as Ultralytics widens boxes under its second stride, it holds those four."""
    anchors = torch.stack(torch.meshgrid(torch.arange(8) * 8 + 4.0, torch.arange(8) * 8 + 4.0, indexing="xy"),
                          -1).view(-1, 2)
    logits = torch.zeros(1, 64, 1)
    pred_boxes = torch.cat((anchors - 8, anchors + 8), -1)[None]  # overlapping the box: CIoU above 0
    gt = (torch.tensor([[0]]), torch.tensor([[[5.0, 5.0, 11.0, 11.0]]]), torch.tensor([[True]]))
    narrow = assign_targets(logits, pred_boxes, anchors, *gt, num_classes=1, config=AssignerConfig(min_side=0.0))
    widened = assign_targets(logits, pred_boxes, anchors, *gt, num_classes=1)
    assert not narrow.foreground.any()
    assert sorted(widened.foreground[0].nonzero().flatten().tolist()) == [0, 1, 8, 9]
