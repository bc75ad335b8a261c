import pytest
import torch
from torchvision.ops import complete_box_iou_loss

from detector.assigner import AssignerConfig, assign_targets
from detector.boxes import boxes_to_distances, dfl_expectation, distances_to_boxes
from detector.loss import (DetectionLoss, PaddedTargets, assignment_chunks, box_slots, complete_iou_loss,
                           distribution_focal_loss, foreground_losses, foreground_slots, frequency_weights,
                           most_boxes_per_image, targets_to_padded)
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


def test_class_weights_multiply_each_class_s_classification_terms_alone():
    """``--cls-pw`` (Ultralytics' cls_pw multiplies its BCE terms by the class's weight): the weighted cls part is the
    sum over classes of weight times that class's unweighted BCE sum, over the same score sum; box and DFL are
    untouched. Both sides sum the same FP32 terms (each term's weight product rounded once) in another grouping:
    each addition rounds by at most eps of its running sum, so n terms are at most about n eps of the part apart."""
    model, plain = _model_and_loss()
    weights = frequency_weights(torch.tensor([30, 5, 1]), 1.0)
    weighted = DetectionLoss(num_classes=3, strides=model.strides, class_weights=weights)
    targets = torch.tensor([[0, 1, 0.5, 0.5, 0.4, 0.4], [1, 2, 0.3, 0.3, 0.2, 0.3], [1, 0, 0.6, 0.6, 0.3, 0.3]])
    outputs = model(torch.rand(2, 3, 64, 64))
    _, parts = plain(outputs, targets, (64, 64), keep_assignment=True)
    assigned = plain.last_assignment
    _, weighted_parts = weighted(outputs, targets, (64, 64), assigned=assigned)
    logits = torch.cat([o.flatten(2) for o in outputs], 2).transpose(1, 2)[..., -3:].float()
    per_class = torch.nn.functional.binary_cross_entropy_with_logits(logits, assigned.scores, reduction="none")
    expected = (per_class.sum((0, 1)) * weights).sum() / assigned.scores.sum().clamp(min=1) * plain.gains.cls
    bound = (logits.numel() + 2) * torch.finfo(torch.float32).eps  # the terms, and their weight and gain products
    torch.testing.assert_close(weighted_parts["cls"], expected, rtol=bound, atol=0)
    assert weighted_parts["box"] == parts["box"] and weighted_parts["dfl"] == parts["dfl"]
    assert not torch.isclose(weighted_parts["cls"], parts["cls"])  # the weights changed something
    assert frequency_weights(torch.tensor([30, 5, 1]), 0.0) is None  # off
    assert frequency_weights(torch.zeros(3, dtype=torch.long), 1.0) is None  # nothing to weigh by
    assert frequency_weights(torch.tensor([7]), 1.0) is None  # one class: its weight would be 1


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
        total, parts = criterion(model(images), given, (64, 64), keep_assignment=True)
        total.backward()
        gradients = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        results.append((total.detach(), parts, gradients, criterion.last_assignment, images.shape))
    # The assignment and the gradients bit for bit: the padding rows are masked out of every candidate set, and each
    # foreground anchor's terms are the same operations whatever the padding. The box and DFL sums add more zero
    # terms (one per padding anchor, foreground_slots) and so in another order: each of the two orders is within
    # (n - 1) eps of the exact sum of n non-negative terms (CIoU and DFL losses and their weights are >= 0), then
    # the division and the gain round once more each side.
    eps = torch.finfo(torch.float32).eps
    n = 3 * (8 * 8 + 4 * 4 + 2 * 2)  # at most every anchor of every image: 3 images, 84 anchors each at 64 px
    first_total, first_parts, first_gradients, first_assignment, _ = results[0]
    for total, parts, gradients, assignment, _ in results[1:]:
        assert all(torch.equal(getattr(assignment, name), getattr(first_assignment, name))
                   for name in ("labels", "boxes", "scores", "foreground"))
        assert len(gradients) == len(first_gradients)
        assert all(torch.equal(a, b) for a, b in zip(gradients, first_gradients))
        assert torch.equal(parts["cls"], first_parts["cls"]) and parts["box"] > 0
        bounds = {key: (2 * (n - 1) + 4) * eps * float(first_parts[key]) for key in ("box", "dfl")}
        assert all(abs(float(parts[key] - first_parts[key])) <= bounds[key] for key in bounds)
        assert abs(float(total - first_total)) <= sum(bounds.values()) + 4 * eps * float(first_total)


def _foreground_case(seed: int, anchors: int = 200, reg_max: int = 16):
    generator = torch.Generator().manual_seed(seed)
    points = torch.rand(anchors, 2, generator=generator) * 20
    corners = torch.rand(2, anchors, 2, generator=generator) * 20
    target = torch.cat((corners - 1, corners + 3), -1)
    logits = torch.randn(2, anchors, 4 * reg_max, generator=generator)
    weights = torch.rand(2, anchors, generator=generator)
    foreground = torch.rand(2, anchors, generator=generator) < 0.2
    # Background anchors whose logits decode to a zero-area box (every distance 0): CIoU of such a box is NaN (0/0
    # in its aspect term), which the padding anchors' safe boxes must keep out of the sums and the gradients.
    degenerate = ~foreground & (torch.arange(anchors) % 7 == 0)
    logits.view(2, anchors, 4, reg_max)[degenerate] = torch.tensor([1e4] + [-1e4] * (reg_max - 1))
    return logits, target, points, weights, foreground


def _indexed_foreground_losses(logits, target, points, weights, foreground, reg_max=16):
    """The reference: the foreground anchors picked by boolean indexing, each computed alone."""
    anchor = points.expand(len(logits), -1, -1)[foreground]
    chosen = logits[foreground]
    pred = distances_to_boxes(anchor, dfl_expectation(chosen, reg_max))
    box_sum = (complete_iou_loss(pred, target[foreground]) * weights[foreground]).sum()
    distances = boxes_to_distances(anchor, target[foreground], reg_max - 1 - 0.01)
    dfl_sum = (distribution_focal_loss(chosen.view(-1, 4, reg_max), distances) * weights[foreground]).sum()
    return box_sum, dfl_sum


def test_foreground_losses_on_fixed_slots_match_the_indexed_ones_with_their_gradients():
    for seed in range(3):
        logits, target, points, weights, foreground = _foreground_case(seed)
        most = int(foreground.sum(1).max())
        results = []
        for compute in (_indexed_foreground_losses,
                        lambda *case: foreground_losses(*case, reg_max=16, slots=most),  # just enough slots
                        lambda *case: foreground_losses(*case, reg_max=16, slots=200)):  # every anchor
            logits_in = logits.clone().requires_grad_()
            box_sum, dfl_sum = compute(logits_in, target, points, weights, foreground)
            (box_sum + dfl_sum).backward()
            results.append((box_sum.detach(), dfl_sum.detach(), logits_in.grad))
        count = int(foreground.sum())
        # Each anchor's terms are the same operations on every path; only the summation differs (count terms, plus
        # zeros for the padding): FP32 summation error is at most count * eps * the sum of |terms| (all terms are
        # non-negative here, so that is the sum itself).
        eps = torch.finfo(torch.float32).eps
        reference = results[0]
        for sums in results[1:]:
            for got, expected in zip(sums[:2], reference[:2]):
                assert torch.isfinite(got) and abs(got - expected) <= count * eps * abs(expected)
            # Per element: background anchors get exactly zero, foreground ones the same values up to the last bits
            # of the 16-bin softmax inside the DFL (a few eps, relative).
            gradient = sums[2]
            assert torch.isfinite(gradient).all()
            assert torch.equal(gradient[~foreground], torch.zeros_like(gradient[~foreground]))
            torch.testing.assert_close(gradient, reference[2], rtol=4 * eps,
                                       atol=4 * eps * float(reference[2].abs().max()))


def test_foreground_losses_without_foreground_are_zero_and_connected():
    logits, target, points, weights, _ = _foreground_case(0)
    logits.requires_grad_()
    box_sum, dfl_sum = foreground_losses(logits, target, points, weights, torch.zeros(2, 200, dtype=torch.bool),
                                         reg_max=16, slots=foreground_slots(200, 16, 10))
    assert box_sum == 0 and dfl_sum == 0 and dfl_sum.requires_grad  # reaches the logits: DDP sees them
    (box_sum + dfl_sum).backward()
    assert torch.equal(logits.grad, torch.zeros_like(logits))


def test_the_assigner_never_gives_an_image_more_foreground_than_its_slots():
    """foreground_losses computes foreground_slots anchors an image and would drop any beyond: the assigner's bound
    (each foreground anchor among some box's top_k) must hold, here with crowded boxes over few anchors and slots
    fewer than the anchors."""
    generator = torch.Generator().manual_seed(0)
    anchors = 84  # a 64-px image: 64 + 16 + 4 anchors
    points = torch.rand(anchors, 2, generator=generator) * 64
    for top_k, boxes in ((1, 16), (3, 16), (5, 8), (10, 4)):
        corners = torch.rand(4, boxes, 2, generator=generator) * 40
        gt_boxes = torch.cat((corners, corners + 10 + torch.rand(4, boxes, 2, generator=generator) * 20), -1)
        half = 2 + torch.rand(4, anchors, 2, generator=generator) * 10  # boxes predicted around each anchor
        predicted = torch.cat((points - half, points + half), -1)
        labels = torch.randint(0, 3, (4, boxes), generator=generator)
        assigned = assign_targets(torch.randn(4, anchors, 3, generator=generator), predicted, points, labels, gt_boxes,
                                  torch.ones(4, boxes, dtype=torch.bool), num_classes=3,
                                  config=AssignerConfig(top_k=top_k))
        most = int(assigned.foreground.sum(1).max())
        assert 0 < most <= foreground_slots(anchors, boxes, top_k) == top_k * boxes < anchors


def test_the_loss_counts_every_foreground_anchor_of_crowded_images():
    """The whole criterion against the indexed reference over its own assignment, on images crowded enough that
    the foreground fills most of the slots: slots too few would drop anchors from the box and DFL sums."""
    from detector.boxes import flatten_head_outputs, make_anchors

    model, criterion = _model_and_loss()
    generator = torch.Generator().manual_seed(3)
    size, batch, boxes = 64, 2, 6  # 84 anchors an image; 16 slots x top_k 10 would be all of them: top_k 2
    criterion.assigner = AssignerConfig(top_k=2, alpha=criterion.assigner.alpha, beta=criterion.assigner.beta)
    centres = 0.15 + 0.7 * torch.rand(batch * boxes, 2, generator=generator)
    targets = torch.cat([torch.arange(batch).repeat_interleave(boxes)[:, None].float(),
                         torch.randint(0, 3, (batch * boxes, 1), generator=generator).float(), centres,
                         torch.full((batch * boxes, 2), 0.45)], 1)
    outputs = model(torch.rand(batch, 3, size, size, generator=generator))
    total, parts = criterion(outputs, targets, (size, size), keep_assignment=True)
    assigned = criterion.last_assignment
    slots = foreground_slots(84, boxes, 2)
    assert slots < 84 and int(assigned.foreground.sum(1).max()) >= slots // 2  # crowded: a dropped anchor shows
    points, stride = make_anchors([o.shape[2:] for o in outputs], model.strides, device=torch.device("cpu"),
                                  dtype=torch.float32)
    box_logits = flatten_head_outputs(outputs)[..., :64].detach()
    box_sum, dfl_sum = _indexed_foreground_losses(box_logits, assigned.boxes / stride, points,
                                                  assigned.scores.sum(-1), assigned.foreground)
    score_sum = assigned.scores.sum().clamp(min=1)
    eps = torch.finfo(torch.float32).eps
    count = int(assigned.foreground.sum())
    for got, reference, gain in ((parts["box"], box_sum, criterion.gains.box), (parts["dfl"], dfl_sum,
                                                                                 criterion.gains.dfl)):
        expected = reference / score_sum * gain
        # the same terms summed in another order (count terms and zeros), then divided and scaled: a few more eps
        assert abs(float(got - expected)) <= (2 * batch * slots + 4) * eps * float(expected) and count > 0


def test_assignment_chunks_cover_the_batch_in_even_slices_under_the_bound(monkeypatch):
    import detector.loss

    monkeypatch.setattr(detector.loss, "ASSIGNER_CHUNK_ELEMENTS", 1000)
    cases = ((64, 32, 8400), (7, 16, 84), (10, 2, 100), (11, 2, 100), (64, 1, 30), (3, 1, 1), (1, 64, 8400),
             (0, 16, 84))
    counts = []
    for batch, slots, anchors in cases:
        chunks = assignment_chunks(batch, slots, anchors)
        covered = [i for chunk in chunks for i in range(batch)[chunk]]
        sizes = [chunk.stop - chunk.start for chunk in chunks]
        assert covered == list(range(batch)) and chunks  # in order, each image once, one chunk for an empty batch
        assert max(sizes) - min(sizes) <= 1  # even
        assert all(size * slots * anchors <= 1000 for size in sizes) or max(sizes) == 1  # one image at least
        counts.append(sizes)
    # as few chunks as the bound allows: 10 images of 200 elements in 2 chunks of 5, 11 in 3 (4 + 4 + 3), 64 of 30
    # in 2 of 32 (33 would be 990 elements: two chunks either way, the even split)
    assert counts[2] == [5, 5] and counts[3] == [4, 4, 3] and counts[4] == [32, 32] and counts[0] == [1] * 64
    monkeypatch.setattr(detector.loss, "ASSIGNER_CHUNK_ELEMENTS", 2**23)
    assert [len(assignment_chunks(64, slots, 8400)) for slots in (16, 32, 128)] == [2, 3, 10]
    assert len(assignment_chunks(16, 16, 8400)) == 1  # a CPU's usual batch: the whole batch at once


@pytest.mark.parametrize("size,classes,batch", [(160, 3, 7), (256, 80, 5)])
def test_the_assignment_in_chunks_gives_the_whole_batch_s_targets_and_loss(monkeypatch, size, classes, batch):
    """Each image is assigned by itself, so chunks of the batch (one image each here) give the whole batch's
    assignment: the same foreground, classes and boxes, and soft scores up to the last bits. A CPU computes the ends of
    its vectorised loops (sigmoid, pow) with the C library's scalar functions, which may round differently, and where a
    loop ends moves with the chunk's length; a small box in every image's last corner puts foreground on the anchors
    where the whole batch's loop ends."""
    import detector.loss

    torch.manual_seed(0)
    model = build_model(num_classes=classes).train()
    criterion = DetectionLoss(num_classes=classes, strides=model.strides)
    generator = torch.Generator().manual_seed(3)
    rows = [[image, int(torch.randint(0, classes, (1,), generator=generator)),
             *(0.1 + 0.8 * torch.rand(2, generator=generator)).tolist(),
             *(0.02 + 0.3 * torch.rand(2, generator=generator)).tolist()]
            for image in range(batch) for _ in range(image * 2 % 9)]  # 0-8 boxes an image, one image without
    rows += [[image, 0, 0.9, 0.9, 0.1, 0.1] for image in range(1, batch)]
    outputs = [output.detach() for output in model(torch.rand(batch, 3, size, size, generator=generator))]
    calls = []

    def counted(*args, **kwargs):
        calls.append(args[0].shape[0])
        return assign_targets(*args, **kwargs)

    monkeypatch.setattr(detector.loss, "assign_targets", counted)
    results = []
    for elements in (2**40, 1):
        monkeypatch.setattr(detector.loss, "ASSIGNER_CHUNK_ELEMENTS", elements)
        total, _ = criterion(outputs, torch.tensor(rows), (size, size), keep_assignment=True)
        results.append((criterion.last_assignment, float(total)))
    assert calls == [batch] + [1] * batch  # the whole batch at once, then one image at a time
    (whole, whole_total), (chunked, chunked_total) = results
    assert whole.foreground.any()
    for name in ("labels", "boxes", "foreground"):
        assert torch.equal(getattr(whole, name), getattr(chunked, name)), name
    # A score is sigmoid(logit) ** 0.5 * iou ** 6, scaled by the box's best IoU over its best alignment: the sigmoid and
    # the power may each differ in the last bit (eps relative), the square root halves the first, and the scale's
    # alignment differs as much again: within 4 eps relative; 8 eps leaves room for one more rounding of each.
    eps = torch.finfo(torch.float32).eps
    assert ((whole.scores - chunked.scores).abs() <= 8 * eps * whole.scores).all()
    # The loss is linear in the scores (BCE's -x * t, the box and DFL weights, their sum as the normaliser): each
    # part moves by at most 16 eps of itself, and classification by 8 eps * |logit| per unit of target mass too.
    largest_logit = max(float(output[:, -classes:].abs().max()) for output in outputs)
    bound = 16 * eps * (abs(whole_total) + criterion.gains.cls * batch * largest_logit)
    assert abs(whole_total - chunked_total) <= bound


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


def test_the_loss_keeps_nothing_of_every_anchors_box_distributions_for_the_backward_pass():
    """The step's memory peaks in the loss, where every activation is alive: what the loss saves for the backward
    pass is the classification logits ([B, A, C]) and the foreground slots' box distributions ([B, K, 4 * reg_max]),
    never a tensor over every anchor's distributions ([B, A, 4 * reg_max], what computing every anchor kept three
    times over: ~0.4 GB at batch 64 and 640 px) nor a copy of all the head's outputs."""
    model, criterion = _model_and_loss()
    size, batch = 256, 2  # 1,344 anchors an image, far more than the 160 slots of 16 boxes x top_k 10
    outputs = [output.detach().requires_grad_() for output in model(torch.rand(batch, 3, size, size))]
    anchors = sum(output.shape[2] * output.shape[3] for output in outputs)
    targets = torch.tensor([[image, 1, 0.5, 0.5, 0.3, 0.3] for image in range(batch)])
    saved: list[int] = []

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor.untyped_storage().nbytes() // tensor.element_size())  # a view keeps all its storage
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
        total, parts = criterion(outputs, targets, (size, size))
    slots = foreground_slots(anchors, box_slots(1), criterion.assigner.top_k)
    assert parts["box"] > 0 and slots < anchors
    assert max(saved) <= max(batch * anchors * 3, batch * slots * 4 * 16)  # 3 classes
    total.backward()


def test_a_training_call_keeps_no_assignment_past_itself():
    """A step's assignment (``[B, A, C]`` scores) is not held into the next step's peak unless asked for."""
    model, criterion = _model_and_loss()
    targets = torch.tensor([[0, 1, 0.5, 0.5, 0.4, 0.4]])
    criterion(model(torch.rand(1, 3, 64, 64)), targets, (64, 64), keep_assignment=True)
    assert criterion.last_assignment is not None
    criterion(model(torch.rand(1, 3, 64, 64)), targets, (64, 64))
    assert criterion.last_assignment is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="page-locked memory needs CUDA")
def test_targets_bound_for_a_gpu_are_padded_in_page_locked_memory():
    """What the graphs' fill and the eager loss copy to the GPU without blocking: page-locked, the same values."""
    targets = torch.tensor([[0, 1, 0.5, 0.5, 0.4, 0.4], [1, 0, 0.3, 0.3, 0.2, 0.3], [1, 2, 0.6, 0.6, 0.2, 0.2]])
    pinned, pageable = (targets_to_padded(targets, 2, (64, 64), slots=16, pin=pin) for pin in (True, False))
    assert all(t.is_pinned() for t in pinned) and not any(t.is_pinned() for t in pageable)
    assert all(torch.equal(a, b) for a, b in zip(pinned, pageable))
