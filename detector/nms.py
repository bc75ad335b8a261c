"""torchvision's compiled NMS kernel, reached without importing the torchvision package.

``import torchvision`` imports all of it (models, datasets, transforms), and its ``ops`` import ``torch._dynamo``:
about 2 s of a 4.4-4.8 s ``predict`` of one image on a 2-core CPU, for a command that compiles nothing. The kernel is a
C++/CUDA operator in torchvision's compiled library, so :func:`nms_kernel` loads that library the way torchvision
itself does (``torch.ops.load_library``) and returns ``torch.ops.torchvision.nms``; where it cannot (a layout it
does not know, a library that does not load), it takes ``torchvision.ops.nms``, whose loader says what is wrong.
Training imports ``torch._dynamo`` anyway (every ``torch.optim`` optimizer does, at its first parameter group),
so this is what ``val`` and ``predict`` save.

:func:`batched_nms` is torchvision's ``batched_nms`` (torchvision/ops/boxes.py, BSD-3-Clause), the same two
strategies at the same sizes, around that kernel. :func:`fixed_point_nms` gives the same answer for a batch of rows
at once in tensor operations, for CUDA, where that kernel walks a call's boxes one by one in a single thread block.
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import threading
from collections.abc import Callable
from pathlib import Path

import torch

# torchvision's compiled operators: "_C_stable" from torchvision 0.29 on, "_C" before.
LIBRARY_STEMS = ("_C_stable", "_C")
# Above this many box coordinates torchvision's batched_nms runs one NMS per group instead of one over boxes
# shifted apart by group (which compares every pair of boxes, O(boxes^2)): 1,000 boxes on the CPU, 25,000 elsewhere
# (torchvision 0.26-0.29).
CPU_COORDINATE_LIMIT, COORDINATE_LIMIT = 4_000, 100_000


def library_files(folder: Path) -> list[Path]:
    """The compiled operator libraries in a torchvision package folder, in the order to try them."""
    return [folder / f"{stem}{suffix}" for stem in LIBRARY_STEMS for suffix in importlib.machinery.EXTENSION_SUFFIXES
            if (folder / f"{stem}{suffix}").is_file()]


def registered_nms() -> Callable[..., torch.Tensor] | None:
    """``torch.ops.torchvision.nms`` when some library has registered it (ours or torchvision's import), else None."""
    try:
        return torch.ops.torchvision.nms
    except (AttributeError, RuntimeError):  # torch says "no attribute" (older: RuntimeError) for an unknown operator
        return None


_LOADING = threading.Lock()  # the CPU's NMS runs images on a thread pool: their first calls load the library once


@functools.cache
def nms_kernel() -> Callable[..., torch.Tensor]:
    """``torch.ops.torchvision.nms(boxes [N, 4] xyxy, scores [N], iou_threshold) -> kept indices``, by score
    descending: from torchvision's compiled library where it loads alone, else through ``import torchvision.ops``."""
    with _LOADING:
        return _load_kernel()


def _load_kernel() -> Callable[..., torch.Tensor]:
    if (kernel := registered_nms()) is not None:
        return kernel
    spec = importlib.util.find_spec("torchvision")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        for path in library_files(Path(folder)):
            try:
                torch.ops.load_library(str(path))
            except (OSError, RuntimeError):  # built for another torch or CUDA: torchvision's import says so below
                continue
            if (kernel := registered_nms()) is not None:
                return kernel
    from torchvision.ops import nms as public_nms  # its own loader; a build without its operators says so on use

    return public_nms


def nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """torchvision's ``nms``: the indices of the boxes kept, by score descending."""
    return nms_kernel()(boxes, scores, iou_threshold)


def batched_nms(boxes: torch.Tensor, scores: torch.Tensor, groups: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """torchvision's ``batched_nms``: NMS within each group (boxes of different groups never suppress each other);
    the kept indices by score descending."""
    if boxes.numel() > (CPU_COORDINATE_LIMIT if boxes.device.type == "cpu" else COORDINATE_LIMIT):
        keep_mask = torch.zeros_like(scores, dtype=torch.bool)
        for group in torch.unique(groups):
            members = torch.where(groups == group)[0]
            keep_mask[members[nms(boxes[members], scores[members], iou_threshold)]] = True
        kept = torch.where(keep_mask)[0]
        return kept[scores[kept].sort(descending=True)[1]]
    if boxes.numel() == 0:
        return torch.empty((0,), dtype=torch.int64, device=boxes.device)
    offsets = groups.to(boxes) * (boxes.max() + torch.tensor(1).to(boxes))
    return nms(boxes + offsets[:, None], scores, iou_threshold)


# Pairs of boxes whose overlap fixed_point_nms computes in one go: its FP64 intermediates take 8 bytes a pair (~128 MB
# at this size, a few alive at a time). At least one row (image) a go, whatever its size.
PAIRS_AT_ONCE = 16 * 2**20
# Pairs of boxes one fixed point is found over: its suppression matrix takes 2 bytes a pair on CUDA (~320 MB at this
# size; 16 images of 3,000 candidates are 144M pairs). Rows beyond it are solved in further groups, a host read a step.
PAIRS_PER_SOLVE = 160 * 2**20


def fixed_point_nms(
    boxes: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor, iou_threshold: float, *, max_iterations: int
) -> torch.Tensor | None:
    """Greedy NMS of each row of a batch at once, in tensor operations: which boxes are kept, bool ``[B, N]``, or
    None where that takes more than ``max_iterations`` steps (the caller then runs :func:`batched_nms`).

    ``boxes``: xyxy ``[B, N, 4]``, each row's best first; ``labels``: ``[B, N]`` (boxes of different labels never
    suppress each other); ``valid``: ``[B, N]``, False for a row's padding. Greedy NMS keeps a box unless a kept box
    before it of its label overlaps it by more than ``iou_threshold``: one pass in that order, which torchvision's
    CUDA kernel walks box by box in one thread block (139 ms of a 446-ms BCCD validation pass on an H200,
    docs/gpu.md). Here every pair's overlap is computed at once, and ``keep = valid and not (any kept box before it
    overlaps it)`` is iterated from ``keep = valid``: that rule determines the first box, then the second, and so on,
    so a fixed point of it is the greedy answer, reached after at most as many steps as the longest chain of boxes
    each suppressing the next (18 on a trained BCCD model's candidates, 4-7 on random ones) plus one that sees
    nothing change (Cluster-NMS, Zheng et al. 2020). The overlap is torchvision's formula in FP64, compared as its
    kernel on that device does (its CUDA kernel with the threshold rounded to FP32): the same boxes kept.
    """
    rows, count = valid.shape
    keep = torch.zeros_like(valid)
    if count == 0:
        return keep
    threshold = float(torch.tensor(iou_threshold, dtype=torch.float32)) if boxes.is_cuda else iou_threshold
    before = torch.ones(count, count, dtype=torch.bool, device=boxes.device).triu_(1)  # [j, i]: j ahead of i
    group = max(1, PAIRS_PER_SOLVE // (count * count))
    for start in range(0, rows, group):
        part = slice(start, start + group)
        solved = _fixed_point(boxes[part].double(), labels[part], valid[part], threshold, before, max_iterations)
        if solved is None:
            return None
        keep[part] = solved
    return keep


def _fixed_point(boxes: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor, threshold: float,
                 before: torch.Tensor, max_iterations: int) -> torch.Tensor | None:
    rows, count = valid.shape
    # A matrix product counts each box's kept suppressors. Every term is 0 or 1, so no rounding of the sum (FP16 on
    # CUDA, whatever its accumulation; FP32 elsewhere) turns a count above zero into zero or the reverse.
    dtype = torch.float16 if boxes.is_cuda else torch.float32
    suppressors = torch.empty(rows, count, count, dtype=dtype, device=boxes.device)  # [b, j, i]: j suppresses i
    step = max(1, PAIRS_AT_ONCE // (count * count))
    for start in range(0, rows, step):
        part = slice(start, start + step)
        suppresses = _over_threshold(boxes[part], threshold) & before
        suppresses &= labels[part, :, None] == labels[part, None, :]
        suppresses &= valid[part, :, None]  # padding suppresses nothing
        suppressors[part] = suppresses
    keep = valid.clone()
    for _ in range(max_iterations):
        updated = valid & ~(torch.bmm(keep[:, None, :].to(dtype), suppressors)[:, 0] > 0)
        if torch.equal(updated, keep):
            return keep
        keep = updated
    return None


def _over_threshold(boxes: torch.Tensor, threshold: float) -> torch.Tensor:
    """``[B, N, N]`` bool: the IoU of boxes j and i (``[b, j, i]``) above ``threshold``, by torchvision's NMS kernels'
    operations in their order (``inter / (area_j + area_i - inter)``), one coordinate at a time (no ``[.., 2]``
    intermediate)."""
    x1, y1, x2, y2 = boxes.unbind(-1)

    def extent(low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:  # [b, j, i]: the overlap along one axis
        return (torch.minimum(high[:, :, None], high[:, None, :]) - torch.maximum(low[:, :, None], low[:, None, :]))

    inter = extent(x1, x2).clamp_(min=0).mul_(extent(y1, y2).clamp_(min=0))
    area = (x2 - x1) * (y2 - y1)
    union = (area[:, :, None] + area[:, None, :]).sub_(inter)
    return inter.div_(union) > threshold
