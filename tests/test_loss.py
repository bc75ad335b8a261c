import pytest
import torch
from torchvision.ops import complete_box_iou_loss

from detector.loss import (DetectionLoss, PaddedTargets, box_slots, complete_iou_loss, most_boxes_per_image,
                           targets_to_padded)
from detector.model import build_model


def _model_and_loss():
    torch.manual_seed(0)
    model = build_model(num_classes=3)
    return model, DetectionLoss(num_classes=3, strides=model.strides)


def test_empty_targets_give_zero_box_loss_and_finite_gradients():
    model, criterion = _model_and_loss()
    total, parts = criterion(model(torch.rand(2, 3, 64, 64)), torch.zeros(0, 6), (64, 64))
    assert parts["box"] == 0 and parts["dfl"] == 0 and parts["cls"] > 0
    total.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_loss_with_targets_is_positive_and_reaches_every_head_branch():
    model, criterion = _model_and_loss()
    targets = torch.tensor([[0, 1, 0.5, 0.5, 0.4, 0.4], [1, 2, 0.3, 0.3, 0.2, 0.3]])
    total, parts = criterion(model(torch.rand(2, 3, 64, 64)), targets, (64, 64))
    assert all(v > 0 for v in parts.values())
    total.backward()
    assert model.head.cv2[0][-1].weight.grad.abs().sum() > 0


def test_targets_to_padded_groups_boxes_by_image():
    targets = torch.tensor([[1, 2, 0.5, 0.5, 0.5, 0.5], [0, 0, 0.25, 0.25, 0.5, 0.5], [1, 1, 0.5, 0.5, 1.0, 1.0]])
    labels, boxes, mask = targets_to_padded(targets, 3, (100, 200))
    assert mask.tolist() == [[True, False], [True, True], [False, False]]
    assert labels[1].tolist() == [2, 1]
    assert torch.allclose(boxes[0, 0], torch.tensor([0.0, 0.0, 100.0, 50.0]))
    fixed = targets_to_padded(targets, 3, (100, 200), slots=16)
    assert fixed.mask.shape == (3, 16) and torch.equal(fixed.mask[:, :2], mask) and not fixed.mask[:, 2:].any()
    try:
        targets_to_padded(targets, 3, (100, 200), slots=1)
    except ValueError as error:
        assert "2 boxes" in str(error)
    else:
        raise AssertionError("one slot cannot hold two boxes")


def test_box_slots_are_powers_of_two_that_hold_the_fullest_image():
    assert [box_slots(n) for n in (0, 1, 16, 17, 100, 1000)] == [16, 16, 16, 32, 128, 1024]
    targets = torch.tensor([[0, 0, 0.5, 0.5, 0.1, 0.1]] * 3 + [[2, 0, 0.5, 0.5, 0.1, 0.1]] * 5)
    assert most_boxes_per_image(targets, 4) == 5 and most_boxes_per_image(torch.zeros(0, 6), 4) == 0


def test_targets_padded_to_a_fixed_count_give_the_same_loss_and_gradients():
    """The captured step pads to a fixed box count (box_slots): the loss and gradients must not notice."""
    generator = torch.Generator().manual_seed(1)
    counts = (3, 0, 7)  # one image without boxes
    rows = []
    for image, count in enumerate(counts):
        for _ in range(count):
            centre = (0.2 + 0.6 * torch.rand(2, generator=generator)).tolist()
            size = (0.1 + 0.3 * torch.rand(2, generator=generator)).tolist()
            rows.append([image, int(torch.randint(0, 3, (), generator=generator)), *centre, *size])
    targets = torch.tensor(rows)
    results = []
    for slots in (None, 16, 64):
        model, criterion = _model_and_loss()
        images = torch.rand(3, 3, 64, 64, generator=torch.Generator().manual_seed(2))
        given = targets if slots is None else PaddedTargets(*targets_to_padded(targets, 3, (64, 64), slots=slots))
        total, parts = criterion(model(images), given, (64, 64))
        total.backward()
        results.append((total, parts, [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    # Bit for bit: the padding rows are masked out of every candidate set, so every sum adds the same
    # terms in the same order.
    for total, parts, grads in results[1:]:
        assert torch.equal(total, results[0][0]) and parts["box"] > 0
        assert all(torch.equal(parts[k], results[0][1][k]) for k in parts)
        assert len(grads) == len(results[0][2]) and all(torch.equal(a, b) for a, b in zip(grads, results[0][2]))


def _foreground_case(seed: int, anchors: int = 200, reg_max: int = 16):
    generator = torch.Generator().manual_seed(seed)
    points = torch.rand(anchors, 2, generator=generator) * 20
    corners = torch.rand(2, anchors, 2, generator=generator) * 20
    pred = torch.cat((corners, corners + torch.rand(2, anchors, 2, generator=generator) * 5), -1)
    target = torch.cat((corners - 1, corners + 3), -1)
    logits = torch.randn(2, anchors, 4 * reg_max, generator=generator)
    weights = torch.rand(2, anchors, generator=generator)
    foreground = torch.rand(2, anchors, generator=generator) < 0.2
    # Zero-area predictions on background anchors: CIoU of such a box is NaN (0/0 in its aspect term), which
    # the dense path must keep out of the sums and the gradients.
    degenerate = ~foreground & (torch.arange(anchors) % 7 == 0)
    pred[degenerate] = pred[degenerate][:, :2].repeat(1, 2)
    return pred, target, logits, points, weights, foreground


def test_dense_foreground_losses_match_the_indexed_ones_with_their_gradients():
    from detector.loss import foreground_losses

    for seed in range(3):
        pred, target, logits, points, weights, foreground = _foreground_case(seed)
        results = {}
        for dense in (False, True):
            pred_in, logits_in = pred.clone().requires_grad_(), logits.clone().requires_grad_()
            box_sum, dfl_sum = foreground_losses(pred_in, target, logits_in, points, weights, foreground,
                                                 reg_max=16, dense=dense)
            (box_sum + dfl_sum).backward()
            results[dense] = (box_sum.detach(), dfl_sum.detach(), pred_in.grad, logits_in.grad)
        count = int(foreground.sum())
        # Each anchor's terms are the same operations on both paths; only the summation differs (count terms,
        # plus the dense path's zeros): FP32 summation error is at most count * eps * the sum of |terms|
        # (all terms are non-negative here, so that is the sum itself).
        eps = torch.finfo(torch.float32).eps
        for indexed, dense in zip(results[False][:2], results[True][:2]):
            assert torch.isfinite(dense) and abs(dense - indexed) <= count * eps * abs(indexed)
        # Gradients are per element: background anchors get exactly zero on both paths, foreground ones the
        # same values up to the last bits of the 16-bin softmax inside the DFL (a few eps, relative).
        for indexed, dense in zip(results[False][2:], results[True][2:]):
            assert torch.isfinite(dense).all()
            assert torch.equal(dense[~foreground], torch.zeros_like(dense[~foreground]))
            torch.testing.assert_close(dense, indexed, rtol=4 * eps, atol=4 * eps * float(indexed.abs().max()))


def test_dense_foreground_losses_without_foreground_are_zero_and_connected():
    from detector.loss import foreground_losses

    pred, target, logits, points, weights, _ = _foreground_case(0)
    logits.requires_grad_()
    for dense in (False, True):
        box_sum, dfl_sum = foreground_losses(pred, target, logits, points, weights, torch.zeros(2, 200, dtype=torch.bool),
                                             reg_max=16, dense=dense)
        assert box_sum == 0 and dfl_sum == 0 and dfl_sum.requires_grad  # reaches the logits: DDP sees them


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_complete_iou_loss_is_torchvisions_values_and_gradients(dtype):
    """torchvision's CIoU (which a CUDA graph cannot capture) as the oracle: overlapping, disjoint, nested, touching
    and identical pairs.

    The loss bit for bit: the same elementwise operations in the same order on same-shaped tensors. Gradients: each
    coordinate's is a sum of at most 16 contributions (4 coordinates x the IoU, enclosing-box, centre and aspect
    terms) that autograd adds in its graph's order, and the two graphs differ, so the sums may round differently:
    by at most 16 * eps * (the sum of their magnitudes). Every term is at most ~4 / (shortest side) and the
    shortest side here is 0.1: <= 40 each. FP16 inputs compute in FP32 (both upcast) and their FP32 gradients
    round back to FP16: one more FP16 rounding of the gradient's own size.
    """
    generator = torch.Generator().manual_seed(0)
    xy = torch.rand(256, 2, generator=generator) * 20
    wh = torch.rand(256, 2, generator=generator) * 10 + 0.1
    boxes = torch.cat([xy, xy + wh], 1)
    shifted = boxes + (torch.rand(256, 4, generator=generator) - 0.5) * 8
    shifted[:, 2:] = torch.maximum(shifted[:, 2:], shifted[:, :2] + 0.1)
    special = torch.tensor([[0.0, 0, 2, 2], [2, 0, 4, 2],  # touching edges: no overlap, zero intersection
                            [0, 0, 10, 10], [3, 3, 4, 4],  # nested
                            [0, 0, 1, 1], [5, 5, 6, 6],  # far apart
                            [1, 1, 3, 3], [1, 1, 3, 3]])  # identical
    first = torch.cat([boxes, special[0::2]]).to(dtype)
    second = torch.cat([shifted, special[1::2]]).to(dtype)
    results = []
    for loss_fn in (complete_iou_loss, lambda a, b: complete_box_iou_loss(a, b, reduction="none")):
        a, b = first.clone().requires_grad_(), second.clone().requires_grad_()
        loss = loss_fn(a, b)
        loss.sum().backward()
        results.append((loss, a.grad, b.grad))
    (ours, *our_grads), (theirs, *their_grads) = results
    assert ours.dtype == theirs.dtype and torch.equal(ours, theirs)
    compute_eps = torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps
    for mine, reference in zip(our_grads, their_grads):
        bound = 16 * compute_eps * 40 + torch.finfo(dtype).eps * reference.abs()
        assert ((mine.double() - reference.double()).abs() <= bound).all()
