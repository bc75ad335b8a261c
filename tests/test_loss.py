import torch

from detector.loss import DetectionLoss, targets_to_padded
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
