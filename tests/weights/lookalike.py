"""Files laid out like Ultralytics' released ``yolov8n.pt``, ``yolo11n.pt`` and ``yolo26n.pt``, written without
Ultralytics.

Our model already has YOLOv8's, YOLO11's and YOLO26's module trees (detector/weights/ultralytics.py maps them layer by
layer), so the file pickles our own modules in Ultralytics' order (``model.model.<i>``) under Ultralytics' class
paths: a pickler that writes those paths for our classes. The reader never imports a class from the file (it
uses inert stand-ins), so it reads this file exactly as it reads a released one.
"""

from __future__ import annotations

import io
import pickle
import types

import torch
from torch import nn

from detector.architecture import family_and_scale
from detector.model import build_model
from detector.model.attention import C2PSA, Attention, C3k2Attention, PSABlock
from detector.model.blocks import SPPF, Bottleneck, C2f, C3k, C3k2, Conv
from detector.model.head import DFL, Detect
from detector.weights.ultralytics import LAYERS, YOLOV8_LAYERS


class DetectionModel(nn.Module):
    """Stands for ``ultralytics.nn.tasks.DetectionModel``: ``.model`` is the layer list."""


class MixedC3k2(C2f):
    """A ``C3k2`` (its class path) holding YOLOv8's C2f layers: a file laid out as YOLOv8 but for layer 2."""


class Concat(nn.Module):
    """Stands for ``ultralytics.nn.modules.conv.Concat`` (parameter-free)."""


CLASS_PATHS = {
    DetectionModel: "ultralytics.nn.tasks",
    Concat: "ultralytics.nn.modules.conv",
    Conv: "ultralytics.nn.modules.conv",
    C2f: "ultralytics.nn.modules.block",
    C3k2: "ultralytics.nn.modules.block",
    C3k2Attention: "ultralytics.nn.modules.block",  # Ultralytics' C3k2(..., attn=True): pickled as a C3k2
    MixedC3k2: "ultralytics.nn.modules.block",
    C3k: "ultralytics.nn.modules.block",
    C2PSA: "ultralytics.nn.modules.block",
    PSABlock: "ultralytics.nn.modules.block",
    Attention: "ultralytics.nn.modules.block",
    Bottleneck: "ultralytics.nn.modules.block",
    SPPF: "ultralytics.nn.modules.block",
    DFL: "ultralytics.nn.modules.block",
    Detect: "ultralytics.nn.modules.head",
}


class _UltralyticsPathPickler(pickle._Pickler):  # the Python pickler: its save_global can be overridden
    def save_global(self, obj: object, name: str | None = None) -> None:
        if obj in CLASS_PATHS:
            name = "C3k2" if obj in (MixedC3k2, C3k2Attention) else obj.__name__
            self.write(pickle.GLOBAL + f"{CLASS_PATHS[obj]}\n{name}\n".encode())
            self.memoize(obj)
            return
        super().save_global(obj, name)


def lookalike_bytes(scale: str = "n", num_classes: int = 80, seed: int = 0, stem_width: int | None = None,
                    yaml_file: str = "") -> bytes:
    """``torch.save`` bytes of ``{"model": <FP16 DetectionModel>, "ema": None, ...}`` with random weights, laid out as
    Ultralytics lays out the model ``scale`` (ours: ``n`` is YOLOv8n, ``11n`` YOLO11n, ``26n`` YOLO26n); ``stem_width``
    gives the first conv another width (a custom model that is none of n/s/m/l/x); ``yaml_file``: what the model's
    ``yaml`` says it was built from (as ``YOLO('yolo11n.yaml').save(...)`` records it)."""
    torch.manual_seed(seed)
    ours = build_model(num_classes=num_classes, scale=scale)
    if stem_width is not None:
        ours.stem.conv.weight = nn.Parameter(torch.zeros(stem_width, *ours.stem.conv.weight.shape[1:]))
    parameter_free = {"Upsample": lambda: nn.Upsample(scale_factor=2.0), "Concat": Concat}
    layers = [getattr(ours, attribute) if attribute else parameter_free[kind]()
              for kind, attribute in LAYERS[ours.family]]
    return _saved(layers, num_classes, yaml_file)


def _saved(layers: list[nn.Module], num_classes: int, yaml_file: str) -> bytes:
    network = DetectionModel()
    network.model = nn.Sequential(*layers)
    network.nc, network.names = num_classes, {i: f"class{i}" for i in range(num_classes)}
    if yaml_file:
        network.yaml = {"yaml_file": yaml_file}
    buffer = io.BytesIO()
    pickle_module = types.SimpleNamespace(__name__="pickle", Pickler=_UltralyticsPathPickler)
    torch.save({"model": network.half(), "ema": None, "license": "AGPL-3.0"}, buffer, pickle_module=pickle_module)
    return buffer.getvalue()


def yolov8_lookalike_bytes(scale: str = "n", num_classes: int = 80, seed: int = 0,
                           stem_width: int | None = None) -> bytes:
    """A YOLOv8 file (:func:`lookalike_bytes`, the model ``scale``)."""
    return lookalike_bytes(scale, num_classes, seed, stem_width)


def mixed_lookalike_bytes() -> bytes:
    """Laid out as YOLOv8n but for layer 2, a ``C3k2``, and the model's ``yaml`` naming ``yolo11n.yaml``: neither
    family's layers (what an edited YAML gives)."""
    torch.manual_seed(0)
    ours = build_model(num_classes=80, scale="n")
    stage2 = MixedC3k2(ours.stage2.cv1.conv.in_channels, ours.stage2.cv2.conv.out_channels, 1, shortcut=True)
    parameter_free = {"Upsample": lambda: nn.Upsample(scale_factor=2.0), "Concat": Concat}
    layers = [getattr(ours, attribute) if attribute else parameter_free[kind]() for kind, attribute in YOLOV8_LAYERS]
    layers[2] = stage2
    return _saved(layers, 80, "yolo11n.yaml")


def as_ultralytics_keys(name: str) -> dict[str, torch.Tensor]:
    """Our model ``name``'s state dict under Ultralytics' keys (``stage2.`` -> ``model.2.``), on the meta device: the
    tensors' names and shapes of Ultralytics' model at that scale, with no memory (the x models are 57-59M)."""
    with torch.device("meta"):
        ours = build_model(num_classes=80, scale=name).state_dict()
    index = {attribute: layer for layer, (_, attribute) in enumerate(LAYERS[family_and_scale(name)[0]]) if attribute}
    return {f"model.{index[key.split('.', 1)[0]]}.{key.split('.', 1)[1]}": tensor for key, tensor in ours.items()}
