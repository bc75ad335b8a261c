"""Fine-tuning onto other classes: the class logits' rows of the weights moved to the classes of the same name.

The final convolution of each class branch (``head.cv3.<level>.2``, and YOLO26's ``head.one2one_cv3.<level>.2``) has
one output row per class. When the new dataset names classes the weights know (COCO weights, a dataset with
``person`` and ``car``), those rows start from what the weights learned for them, in the new order; the other rows
keep their fresh initialisation. Ultralytics 8.4
does the same (names compared without case or surrounding spaces), so a fine-tune starts where its does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import torch

# YOLO26's one-to-one class branch (head.one2one_cv3) has a row per class as head.cv3 has: its rows move alike.
_CLASS_LOGITS = re.compile(r"head\.(?:one2one_)?cv3\.\d+\.2\.(weight|bias)")


def _placeholder(names: Sequence[str]) -> bool:
    """Names that say nothing: none, or each class its own index (Ultralytics' YAML-built models: ``"0"``, ``"1"``)."""
    return not names or all(str(name).strip() == str(index) for index, name in enumerate(names))


def class_row_sources(source_names: Sequence[str], target_names: Sequence[str]) -> list[int] | None:
    """For each target class the source row of the same name (``-1``: none); ``None`` when there is nothing to move:
    placeholder names on either side, no name in common, or the same names in the same order (copied as they are)."""
    if _placeholder(source_names) or _placeholder(target_names):
        return None
    lookup: dict[str, int] = {}
    for index, name in enumerate(source_names):
        lookup.setdefault(str(name).strip().lower(), index)  # the first of a repeated name, as a dict lookup finds
    rows = [lookup.get(str(name).strip().lower(), -1) for name in target_names]
    if all(row < 0 for row in rows) or rows == list(range(len(source_names))):
        return None
    return rows


def remap_class_rows(incoming: Mapping[str, torch.Tensor], own: Mapping[str, torch.Tensor],
                     rows: Sequence[int]) -> dict[str, torch.Tensor]:
    """The class-logit tensors of ``own`` (the fresh model's, our key names) with each row ``j`` that has a source
    (``rows[j] >= 0``) taken from ``incoming``'s row ``rows[j]``. A level whose input width differs (another class
    branch width) is left out, its bias with its weight: a weight's rows cannot be moved, and a bias alone would be
    counted as a class that starts from the weights' while its weight row is fresh."""
    moved: dict[str, torch.Tensor] = {}
    target = torch.tensor([j for j, row in enumerate(rows) if row >= 0])
    source = torch.tensor([row for row in rows if row >= 0])
    for key, tensor in own.items():
        weight = key.rsplit(".", 1)[0] + ".weight"  # the level's convolution weight, whose width decides
        if (not _CLASS_LOGITS.fullmatch(key) or key not in incoming or weight not in incoming or weight not in own
                or incoming[weight].shape[1:] != own[weight].shape[1:]):
            continue
        result = tensor.detach().clone()
        result[target] = incoming[key][source].to(result.dtype)
        moved[key] = result
    return moved


def moved_class_rows(incoming: Mapping[str, torch.Tensor], own: Mapping[str, torch.Tensor],
                     source_names: Sequence[str], target_names: Sequence[str]) -> tuple[dict[str, torch.Tensor], int]:
    """:func:`remap_class_rows` by the names (:func:`class_row_sources`): -> (the moved tensors, how many of the
    target classes found a source row); ``({}, 0)`` when nothing moves."""
    rows = class_row_sources(source_names, target_names)
    moved = remap_class_rows(incoming, own, rows) if rows else {}
    return moved, sum(row >= 0 for row in rows) if moved and rows else 0
