"""Class-logit rows moved to the classes of the same name (detector/weights/class_rows.py)."""

from __future__ import annotations

import torch

from detector.weights.class_rows import class_row_sources, remap_class_rows


def test_rows_are_found_by_name_without_case_or_spaces() -> None:
    assert class_row_sources(["person", "car", "dog"], [" Dog", "zebra", "PERSON"]) == [2, -1, 0]


def test_nothing_moves_where_nothing_can_be_learned_from_the_names() -> None:
    assert class_row_sources(["person", "car"], ["person", "car"]) is None  # copied as they are
    assert class_row_sources(["0", "1", "2"], ["person", "car"]) is None  # a YAML-built model's placeholders
    assert class_row_sources([], ["person"]) is None
    assert class_row_sources(["person", "car"], ["zebra"]) is None
    assert class_row_sources(["person", "car"], ["car", "person"]) == [1, 0]  # the same classes reordered


def test_only_the_final_convs_rows_move_and_other_widths_are_left_alone() -> None:
    incoming = {"head.cv3.0.2.weight": torch.arange(12.0).reshape(3, 4, 1, 1), "head.cv3.0.2.bias": torch.arange(3.0),
                "head.cv3.1.2.weight": torch.ones(3, 8, 1, 1), "head.cv3.0.1.bn.bias": torch.ones(3)}
    own = {"head.cv3.0.2.weight": torch.full((2, 4, 1, 1), -1.0), "head.cv3.0.2.bias": torch.full((2,), -1.0),
           "head.cv3.1.2.weight": torch.zeros(2, 4, 1, 1), "head.cv3.0.1.bn.bias": torch.zeros(3)}
    moved = remap_class_rows(incoming, own, [2, -1])
    assert set(moved) == {"head.cv3.0.2.weight", "head.cv3.0.2.bias"}
    assert moved["head.cv3.0.2.bias"].tolist() == [2.0, -1.0]
    assert moved["head.cv3.0.2.weight"][:, :, 0, 0].tolist() == [[8.0, 9.0, 10.0, 11.0], [-1.0] * 4]
    assert own["head.cv3.0.2.bias"].tolist() == [-1.0, -1.0]  # the model's own tensors are not written


def test_a_level_whose_weight_cannot_move_keeps_its_bias_too() -> None:
    """Another branch width: the weight's rows cannot move, so neither does the bias (moved alone it would count a
    class as starting from the weights' while its weight row stays fresh)."""
    incoming = {"head.cv3.0.2.weight": torch.ones(3, 8, 1, 1), "head.cv3.0.2.bias": torch.arange(3.0)}
    own = {"head.cv3.0.2.weight": torch.zeros(2, 4, 1, 1), "head.cv3.0.2.bias": torch.zeros(2)}
    assert remap_class_rows(incoming, own, [2, -1]) == {}
