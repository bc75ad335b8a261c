"""The run's validation: its loader (made once, so its workers persist between epochs), the model it runs (the
EMA, as an FP16 copy under CUDA FP16: detector/inference/torch_backend.py) and the COCO evaluator it scores with."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.utils.data import DataLoader

from detector.data.build import SplitData
from detector.inference.torch_backend import make_torch_infer, validation_model
from detector.metrics.coco import resolve_backend
from detector.metrics.loop import Validation, make_val_loader, run_validation
from detector.postprocess import NMSConfig
from detector.precision import Precision
from detector.training.config import TrainConfig
from detector.training.probe import time_validation_images


class Validator:
    """Validates a model of the run on ``split`` with the config's thresholds, batch and evaluator."""

    def __init__(self, split: SplitData, config: TrainConfig, device: torch.device, *, progress: bool) -> None:
        self.split, self.config, self.device, self.progress = split, config, device, progress
        self._loader: DataLoader | None = None

    def loader(self) -> DataLoader:
        if self._loader is None:
            self._loader = make_val_loader(self.split, batch_size=self.config.batch * 2, workers=self.config.workers,
                                           cpu_compute=self.device.type == "cpu",
                                           pin_memory=self.device.type == "cuda")
        return self._loader

    def infer(self, model: nn.Module, precision: Precision) -> Callable[[torch.Tensor], list[dict[str, torch.Tensor]]]:
        config = self.config
        nms = NMSConfig(conf_threshold=config.val_conf, iou_threshold=config.val_iou, max_detections=config.max_det,
                        multi_label=True)
        return make_torch_infer(validation_model(model, precision), precision=precision, nms=nms, device=self.device,
                                channels_last=config.channels_last)

    def run(self, model: nn.Module, precision: Precision, *, keep_predictions: bool = False) -> Validation:
        # predictions.json is written by the final evaluations only (the trainer's after_epoch and after_train): at
        # COCO size (1.5M detections) its json.dumps costs seconds, every epoch, for a file the next epoch replaces.
        return run_validation(self.infer(model, precision), self.split, self.loader(), progress=self.progress,
                              keep_predictions=keep_predictions, coco_eval=resolve_backend(self.config.coco_eval))

    def seconds_per_image(self, model: nn.Module, precision: Precision) -> float | None:
        """Inference and NMS on part of the first validation batch, for the ``--time`` probe (None: no images)."""
        if not len(self.split.records):
            return None
        images = next(iter(self.loader()))[0]
        return time_validation_images(self.infer(model, precision), images)
