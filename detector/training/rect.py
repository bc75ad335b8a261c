"""``--rect`` (Ultralytics' ``rect=True``): training batches of similar aspect ratio, each warped into its own canvas
instead of the ``--imgsz`` square, and what that turns off.

A rectangular item is one image in its batch's canvas (:meth:`detector.data.dataset.DetectionDataset.with_canvases`),
so mosaic, MixUp and CutMix, which mix images in a square, are off (Ultralytics sets them to 0 under rect=True too).
Multi-scale stays on, as Ultralytics' multi_scale scales rect batches: a batch's canvas (long side ``--imgsz``) is
resized so that its long side is the step's drawn size, the other side rounded up to the stride
(:func:`detector.training.step_input.sized_shape`). The geometry stays in the loader
workers: the device warp (``--pixel-augment device``, auto's choice on CUDA) renders squares, so the run takes
``pixels`` instead (HSV and flips on the device, which take any shape). CUDA graphs are off: they are captured per
input shape, and a dataset of mixed aspect ratios has a canvas per few batches (each new shape costs eager warm-up
runs and a capture, and the keys beyond 64 run eagerly anyway: detector/training/graph_keys.py); one canvas (BCCD)
would replay well, but that is not known before the sampler is built, after the step. The sampler is
:class:`detector.data.sampler.RectBatchSampler`.

Every setting here is resolved from the config as asked (config.yaml keeps ``--mosaic 1`` beside ``--rect``, so a
``cfg=config.yaml`` without ``rect`` trains as the flags say); the run's header and resolved.yaml say what it got.
"""

from __future__ import annotations

import torch

from detector.data.batch_augment import resolve_pixel_augment
from detector.training.config import TrainConfig


def mixing(config: TrainConfig) -> dict[str, float]:
    """``{"mosaic", "mixup", "cutmix"}`` as the run has them: each 0 under ``--rect`` (its items are one image each)."""
    return {name: 0.0 if config.rect else getattr(config, name) for name in ("mosaic", "mixup", "cutmix")}


def cuda_graphs_choice(config: TrainConfig) -> str:
    """``--cuda-graphs`` as the step takes it: ``off`` under ``--rect`` (a graph per canvas)."""
    return "off" if config.rect else config.cuda_graphs


def augment_placement(config: TrainConfig, device: torch.device) -> str:
    """Where augmentation runs (:func:`resolve_pixel_augment`), with ``--rect``'s geometry kept in the workers:
    ``device`` becomes ``pixels``."""
    where = resolve_pixel_augment(config.pixel_augment, device)
    return "pixels" if config.rect and where == "device" else where


def rect_notes(config: TrainConfig, device: torch.device, *, world_size: int) -> list[str]:
    """One ``note:`` line for each thing ``--rect`` turns off that the run would otherwise have done."""
    if not config.rect:
        return []
    notes = []
    mixes = [f"--{name} {getattr(config, name):g}" for name in ("mosaic", "mixup", "cutmix") if getattr(config, name)]
    if mixes:  # as Ultralytics' rect=True sets mosaic, mixup and cutmix to 0
        notes.append(f"note: --rect trains without mosaic, MixUp and CutMix ({', '.join(mixes)} off): each item is "
                     "its own image in its batch's canvas")
    if resolve_pixel_augment(config.pixel_augment, device) == "device":
        notes.append(f"note: --rect warps in the loader workers: --pixel-augment {config.pixel_augment} runs as "
                     "pixels (HSV and flips on the device)")
    if config.cuda_graphs != "off" and device.type == "cuda" and world_size == 1:
        notes.append("note: --rect turns CUDA graphs off: they are captured per input shape, and each canvas is one")
    return notes
