"""torchvision's compiled NMS kernel, reached without importing the torchvision package.

``import torchvision`` imports all of it (models, datasets, transforms), and its ``ops`` import ``torch._dynamo``:
about 2 s of a 4.4-4.8 s ``predict`` of one image on a 2-core CPU, for a command that compiles nothing. The kernel is a
C++/CUDA operator in torchvision's compiled library, so :func:`nms_kernel` loads that library the way torchvision
itself does (``torch.ops.load_library``) and returns ``torch.ops.torchvision.nms``; where it cannot (a layout it
does not know, a library that does not load), it takes ``torchvision.ops.nms``, whose loader says what is wrong.
Training imports ``torch._dynamo`` anyway (every ``torch.optim`` optimizer does, at its first parameter group),
so this is what ``val`` and ``predict`` save.

:func:`batched_nms` is torchvision's ``batched_nms`` (torchvision/ops/boxes.py, BSD-3-Clause), the same two
strategies at the same sizes, around that kernel.
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
