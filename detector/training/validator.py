"""The run's validation: its batches (loaded once and kept when they fit, see :class:`Validator`), the model it runs
(a BatchNorm-folded copy of the EMA, FP16 under CUDA FP16: :class:`~detector.inference.fusion.FusedCopy`) and the
COCO evaluator it scores with."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from detector.checkpoint import load_weights
from detector.data.build import SplitData
from detector.data.workers import stop_workers, usable_cores
from detector.distributed import unwrap
from detector.loss import DetectionLoss
from detector.inference.fusion import FusedCopy
from detector.inference.cuda_graph import CudaGraphRunner
from detector.inference.torch_backend import decode_images_with_maps, make_torch_infer
from detector.forked import HELPER_MIN_CORES, fork_available
from detector.metrics.background import BackgroundScorer
from detector.metrics.coco import resolve_backend
from detector.metrics.loop import Detections, Scoring, Validation, make_val_loader, run_validation
from detector.metrics.val_loss import InferWithLoss, LossMeter
from detector.postprocess import NMSConfig, non_max_suppression
from detector.precision import Precision
from detector.training.config import TrainConfig
from detector.training.probe import PROBE_IMAGES, time_validation_images
from detector.tuning import heuristics_over_many_shapes

# Validation batches are kept in memory after the first pass when the split's letterboxed images take at most this
# many bytes (BCCD's 87 images at 640 px: 107 MB; COCO val2017's 5,000: 6.1 GB, loaded every time). Validation
# images are not augmented, so every pass would decode and letterbox the same pixels again: on a 2-core CPU the
# loader's first batch cost ~1.7 s of every per-epoch validation of 16 images at 160 px with persistent workers
# (benchmarks/val_speed.py, "loader first batch", warm), more than the rest of a GPU's validation.
KEEP_BATCHES_BYTES = 512 * 2**20
# On CUDA a pass's forward and box decode replay CUDA graphs, one per batch shape, captured in the first pass and
# kept (the folded copy is refreshed in place, so they read each pass's weights): a nano forward launches ~250
# kernels a batch, each paid on the host, and a BCCD pass (87 images, batches of 16: two shapes) is six forwards
# every epoch. At most GRAPHED_SHAPES graphs, whose outputs stay allocated for the run, at most GRAPHED_OUTPUT_BYTES
# of them; a split whose rectangular batches take more shapes (COCO val's) runs the others eagerly. A shape's
# outputs are the decoded [B, A, 4 + C] FP32 and the raw maps the loss reads ([B, 64 + C, H, W] a level, FP16 under
# CUDA FP16): 2.8 + 13.5 MB for BCCD's batch of 16 (640x480, 3 classes), 45 + 39 MB at 640x640 with 80 classes
# and 90 + 77 MB at batch 32. The cap was 128 MB for the decoded outputs alone; with the maps beside them it is
# 192 MB, which keeps what was graphed then (two such shapes at batch 16, one at batch 32) for 64 MB more at most.
GRAPHED_SHAPES = 8
GRAPHED_OUTPUT_BYTES = 192 * 2**20
# --val-background auto scores a pass in the background (detector/metrics/background.py) on CUDA after epochs whose
# training took less than this: there the COCO evaluation is a large share of an epoch (BCCD on an H200: ~0.13 s
# against 0.16 s of training), and an epoch's metrics line and best.pt come one epoch later, seconds later. After a
# longer epoch (COCO: minutes) the evaluation is a small share, and the metrics are worth having at once.
BACKGROUND_EPOCH_SECONDS = 60.0
# ...and where the host has a core to spare (detector.forked.HELPER_MIN_CORES).


def validation_batch(config: TrainConfig, device: torch.device) -> int:
    """Images per validation batch: twice the training batch on the CPU, where no memory is at stake, and the
    training batch itself on CUDA, where inference at twice the batch raised the run's peak memory above the
    training step's (the issue measured 12.8 GB at batch 64 against 7.65 GB for the step alone)."""
    return config.batch if device.type == "cuda" else config.batch * 2


def graphed_forward(model: nn.Module, precision: Precision, device: torch.device, *,
                    channels_last: bool, largest_batch: tuple[int, int] = (0, 0)) -> CudaGraphRunner:
    """``model``'s forward and box decode on uint8 CUDA batches, replayed from CUDA graphs (up to
    :data:`GRAPHED_SHAPES` and :data:`GRAPHED_OUTPUT_BYTES`; other shapes eager), as validation runs them: each call
    returns the decoded boxes and then the head's raw maps (:func:`decode_images_with_maps`; the loss reads them).
    ``largest_batch``: (images, side) of the largest: every shape's input is then a view of one uint8 memory."""
    forward = functools.partial(decode_images_with_maps, model, precision=precision, device=device,
                                channels_last=channels_last)
    images, side = largest_batch
    return CudaGraphRunner(forward, max_graphs=GRAPHED_SHAPES, max_output_bytes=GRAPHED_OUTPUT_BYTES,
                           input_bytes=images * 3 * side * side)


def scores_in_background(choice: str, device: torch.device, epoch_seconds: float) -> bool:
    """Whether ``--val-background`` ``choice`` scores the pass after an epoch of ``epoch_seconds`` in the background:
    ``on``/``off`` as said; ``auto`` on CUDA after a short epoch (:data:`BACKGROUND_EPOCH_SECONDS`) where the host
    has a core to spare (:data:`~detector.forked.HELPER_MIN_CORES`). Never where the platform cannot fork the worker."""
    if choice == "auto":
        wanted = (device.type == "cuda" and epoch_seconds < BACKGROUND_EPOCH_SECONDS
                  and usable_cores() >= HELPER_MIN_CORES)
    else:
        wanted = choice == "on"
    return wanted and fork_available()


def background_text(choice: str, device: torch.device) -> str:
    """What the run header says after the evaluator about ``--val-background`` ``choice`` on ``device``."""
    if not scores_in_background(choice, device, epoch_seconds=0.0):  # not even after the shortest epoch
        return ""
    return ", in the background" + ("" if choice == "on" else f" after epochs under {BACKGROUND_EPOCH_SECONDS:.0f} s")


def validation_dtype(precision: Precision) -> torch.dtype:
    """The weights' dtype of the copy validation runs: FP16 under CUDA FP16 (see :meth:`Validator.model_for`), else
    FP32 (under the precision's autocast)."""
    return torch.float16 if precision.name == "fp16" and precision.device_type == "cuda" else torch.float32


class Validator:
    """Validates a model of the run on ``split`` with the config's thresholds, batch and evaluator.

    The first pass runs the loader (its workers persist between passes) and keeps the batches when the split fits
    :data:`KEEP_BATCHES_BYTES`; later passes read them from memory and the loader, workers and all, is dropped.
    """

    def __init__(self, split: SplitData, config: TrainConfig, device: torch.device, *, progress: bool) -> None:
        self.split, self.config, self.device, self.progress = split, config, device, progress
        self._loader: DataLoader | None = None
        self._kept: list[tuple] | None = None
        self._copy: FusedCopy | None = None
        self._graphs: tuple[nn.Module, str, CudaGraphRunner] | None = None  # the copy and precision they replay
        self.canvases: np.ndarray | None = None  # each image's (height, width) in rectangular batches, once known
        self._scorer: BackgroundScorer | None = None
        self.keep = len(split.records) * 3 * split.dataset.image_size**2 <= KEEP_BATCHES_BYTES  # uint8 pixels

    def loader(self) -> DataLoader:
        if self._loader is None:
            self._loader = make_val_loader(self.split, batch_size=validation_batch(self.config, self.device),
                                           workers=self.config.workers, cpu_compute=self.device.type == "cpu",
                                           pin_memory=self.device.type == "cuda", rect=self.config.val_rect)
            self.canvases = self._loader.dataset.canvas_hw  # type: ignore[attr-defined]
        return self._loader

    def batches(self) -> Iterable[tuple]:
        """The validation batches: from memory after a first pass that kept them, else from the loader."""
        if self._kept is not None:
            return self._kept
        return self._keeping(self.loader()) if self.keep else self.loader()

    def _keeping(self, loader: DataLoader) -> Iterator[tuple]:
        kept = []
        for batch in loader:
            kept.append(batch)
            yield batch
        self._kept, self._loader = kept, None  # a whole pass: its workers can go

    def close(self) -> None:
        """Stop the loader's workers (:func:`detector.data.workers.stop_workers`) and the background scorer's,
        after the pass it is scoring; a later pass starts new ones."""
        stop_workers(self._loader)
        self._loader = None
        if self._scorer is not None:
            self._scorer.close()

    def scorer(self) -> BackgroundScorer:
        """The run's background scorer (made on first use; its worker is forked at :meth:`BackgroundScorer.start`
        or at its first pass)."""
        if self._scorer is None:
            assert self.split.ground_truth is not None, "evaluation split was built without ground truth"
            self._scorer = BackgroundScorer(self.split.ground_truth, backend=resolve_backend(self.config.coco_eval),
                                            split=self.split)
        return self._scorer

    def model_for(self, model: nn.Module, precision: Precision) -> nn.Module:
        """``model`` as validation runs it: its folded copy (made once per model and dtype, refreshed every pass),
        in FP16 under CUDA FP16 (Ultralytics validates its EMA in half precision too: autocast would cast every
        weight again on every forward), else in FP32 under the precision's autocast. The copy's outputs differ from
        the model's in rounding only: folding rounds each weight once more (detector/inference/fusion.py), and FP16
        weights round BatchNorm's folded scale too; the final FP32 evaluation gets an FP32 copy."""
        source = unwrap(model)
        dtype = validation_dtype(precision)
        if self._copy is None or self._copy.source is not source or self._copy.dtype != dtype:
            self._copy = FusedCopy(source, dtype=dtype, channels_last=self.config.channels_last)
        return self._copy.refresh()

    def infer(self, model: nn.Module, precision: Precision, *, graphed: bool = True,
              criterion: DetectionLoss | None = None) -> Callable[[torch.Tensor], Detections] | InferWithLoss:
        """Inference and NMS on a validation batch; the forward and decode from CUDA graphs where they fit
        (:data:`GRAPHED_SHAPES`; ``graphed=False``: eager). With ``criterion``, an :class:`InferWithLoss`: the loss
        of each batch's targets too, from the head's raw maps of the same forward."""
        with_maps = criterion is not None
        config = self.config
        nms = NMSConfig(conf_threshold=config.val_conf, iou_threshold=config.val_iou, max_detections=config.max_det,
                        multi_label=True)
        copy = self.model_for(model, precision)
        runner = self._graph_runner(copy, precision) if graphed else None

        @torch.no_grad()
        def replayed(images: torch.Tensor) -> Detections | tuple[Detections, list[torch.Tensor]]:
            decoded, *maps = runner(images.to(self.device, non_blocking=True))
            detections = non_max_suppression(decoded, nms)
            return (detections, maps) if with_maps else detections

        infer = replayed if runner is not None else make_torch_infer(
            copy, precision=precision, nms=nms, device=self.device, channels_last=config.channels_last,
            with_maps=with_maps)
        return InferWithLoss(infer, LossMeter(criterion)) if criterion is not None else infer

    def _graph_runner(self, copy: nn.Module, precision: Precision) -> CudaGraphRunner | None:
        """The graphs of ``copy``'s forward and decode under ``precision`` (made on first use, up to
        :data:`GRAPHED_SHAPES` shapes and :data:`GRAPHED_OUTPUT_BYTES`: other shapes run eagerly); None off CUDA."""
        if self.device.type != "cuda":
            return None
        if self._graphs is None or self._graphs[0] is not copy or self._graphs[1] != precision.name:
            runner = graphed_forward(copy, precision, self.device, channels_last=self.config.channels_last,
                                     largest_batch=(validation_batch(self.config, self.device), self.config.imgsz))
            self._graphs = copy, precision.name, runner
        return self._graphs[2]

    def run(self, model: nn.Module, precision: Precision, *, keep_predictions: bool = False,
            background: bool = False, graphed: bool = True, criterion: DetectionLoss | None = None) -> Validation:
        """One pass; ``background``: its COCO scoring in the worker process (detector/metrics/background.py), the
        returned :class:`Validation` waiting for it where its result is read. ``criterion``: the pass's loss too
        (:attr:`Validation.losses`), from the forward that gave its detections. Every pass is scored with the val
        table's mean P and R too (results.csv's P and R), where its mAP is."""
        # predictions.json is written by the final evaluations only (the trainer's after_epoch and after_train): at
        # COCO size (1.5M detections) its json.dumps costs seconds, every epoch, for a file the next epoch replaces.
        batches = self.batches()
        shapes = 1 if self.canvases is None else len(np.unique(self.canvases, axis=0))
        backend = resolve_backend(self.config.coco_eval)
        with heuristics_over_many_shapes(self.device, shapes, self.config.cudnn_benchmark):
            infer = self.infer(model, precision, graphed=graphed, criterion=criterion)
            scoring = Scoring(backend, self.scorer() if background else None, precision_recall=True)
            return run_validation(infer, self.split, batches, progress=self.progress,
                                  keep_predictions=keep_predictions, scoring=scoring)

    def run_weights(self, model: nn.Module, weights: dict[str, Any], path: Path, precision: Precision) -> Validation:
        """One pass of ``model``'s architecture with ``weights`` (a state dict read from ``path``: best.pt's FP16
        weights), predictions kept; ``model`` itself is left as it was."""
        copied = copy.deepcopy(model)
        load_weights(copied, weights, path)  # copied into the model's own parameters: their type and layout stay
        return self.run(copied, precision, keep_predictions=True, graphed=False)  # one pass: no graphs to capture

    def seconds_per_image(self, model: nn.Module, precision: Precision,
                          criterion: DetectionLoss | None = None) -> float | None:
        """Inference and NMS on part of the first validation batch, for the ``--time`` probe (None: no images);
        with ``criterion``, the loss a pass computes too (:meth:`run`)."""
        if not len(self.split.records):
            return None
        images, targets = (self._kept[0] if self._kept else next(iter(self.loader())))[:2]
        images = images[:PROBE_IMAGES]
        # Eager: its few images are a batch shape no pass has, which would get a graph of its own for the run.
        infer = self.infer(model, precision, graphed=False, criterion=criterion)
        if isinstance(infer, InferWithLoss):  # the loss of these images' own boxes, as a pass adds it
            infer = functools.partial(infer, targets=targets[targets[:, 0] < len(images)])
        seconds = time_validation_images(infer, images)
        if self.canvases is not None:  # rectangular batches come in aspect order: scale to the mean canvas's pixels
            seconds *= float((self.canvases[:, 0] * self.canvases[:, 1]).mean()) / (images.shape[-2] * images.shape[-1])
        return seconds
