"""Start from Ultralytics YOLOv8 detection weights (``yolov8n.pt`` ... ``yolov8x.pt``).

Those files pickle Ultralytics' own classes. We never import ``ultralytics`` (it is AGPL-3.0) and never
run code from the file: :mod:`detector.weights.safe_pickle` reads it into inert stand-ins, and this module
walks them for tensors, renames YOLOv8 layer indices (``model.4.``) to our attribute names
(``stage3.``) and copies the result into a :class:`~detector.model.YOLO`.

Typical use::

    checkpoint = read_ultralytics_checkpoint(resolve_weights("yolov8n.pt"))
    model = build_model(num_classes=3, scale=checkpoint.scale, class_channels=checkpoint.class_channels)
    report = load_pretrained(model, checkpoint, names=["cat", "dog", "person"])
    print(report.summary())
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from detector.model.yolo import SCALES, YOLO
from detector.weights.class_rows import moved_class_rows
from detector.weights.locate import resolve_weights
from detector.weights.safe_pickle import StandIn, load_checkpoint, stand_in_state_dict

# YOLOv8 detection layers in order: (Ultralytics class name, our attribute or None for parameter-free layers).
YOLOV8_LAYERS: tuple[tuple[str, str | None], ...] = (
    ("Conv", "stem"),  # 0
    ("Conv", "down2"),
    ("C2f", "stage2"),
    ("Conv", "down3"),
    ("C2f", "stage3"),
    ("Conv", "down4"),  # 5
    ("C2f", "stage4"),
    ("Conv", "down5"),
    ("C2f", "stage5"),
    ("SPPF", "sppf"),
    ("Upsample", None),  # 10
    ("Concat", None),
    ("C2f", "top_down4"),
    ("Upsample", None),
    ("Concat", None),
    ("C2f", "top_down3"),  # 15
    ("Conv", "bottom_up_down3"),
    ("Concat", None),
    ("C2f", "bottom_up4"),
    ("Conv", "bottom_up_down4"),
    ("Concat", None),  # 20
    ("C2f", "bottom_up5"),
    ("Detect", "head"),
)
_LAYER_KEY = re.compile(r"model\.(\d+)\.(.+)")
# The classification branch: its widths depend on the class count, so it is re-initialised when that differs.
_CLASS_BRANCH = re.compile(r"(head\.cv3\.\d+\.\d+)\.")


@dataclass(frozen=True)
class UltralyticsCheckpoint:
    """The parts of an Ultralytics detection checkpoint we use."""

    path: Path
    state_dict: dict[str, torch.Tensor]  # Ultralytics keys ("model.0.conv.weight"), dtype as stored (often FP16)
    layer_types: tuple[str, ...]  # class name of each ``model.<i>`` layer, e.g. ("Conv", "Conv", "C2f", ...)
    num_classes: int
    names: dict[int, str]  # class index -> name; empty when the file has none
    source: str  # "ema" or "model": which entry of the checkpoint the weights came from

    @property
    def scale(self) -> str:
        """YOLOv8 scale (``n s m l x``), read from tensor shapes."""
        return detect_yolov8_scale(self.state_dict)

    @property
    def class_channels(self) -> int:
        """The class branch's hidden width. Not always YOLOv8's default for the class count: Ultralytics 8.4 keeps
        the width of the weights a model was fine-tuned from (a 3-class nano from ``yolov8n.pt`` is 80 wide)."""
        return int(self.state_dict["model.22.cv3.0.0.conv.weight"].shape[0])

    @property
    def class_names(self) -> list[str]:
        """One name per class, the index where the file has none."""
        return [self.names.get(index, str(index)) for index in range(self.num_classes)]


@dataclass(frozen=True)
class LoadReport:
    """What :func:`load_pretrained` did."""

    path: Path
    scale: str
    matched: int  # tensors copied from the checkpoint
    reinitialised: tuple[str, ...]  # model keys left at their fresh initialisation
    num_classes: int  # the model's
    source_num_classes: int  # the checkpoint's
    source_names: dict[int, str] = field(default_factory=dict)
    named: int = 0  # the model's classes whose logit rows came from the weights' class of the same name

    def summary(self) -> str:
        """One line for logs."""
        line = f"loaded {self.matched} tensors from {self.path} (YOLOv8{self.scale}, {self.source_num_classes} classes)"
        if self.named:
            line += (f"; {self.named} of the model's {self.num_classes} classes start from the weights' class of the "
                     f"same name, {self.num_classes - self.named} fresh")
        if self.reinitialised:
            line += (
                f"; the model has {self.num_classes} classes, so {len(self.reinitialised)}"
                " classification-branch tensors keep their fresh initialisation"
            )
        return line


def read_ultralytics_checkpoint(path: str | Path) -> UltralyticsCheckpoint:
    """Read an Ultralytics ``.pt`` detection checkpoint without importing ultralytics or running its code.

    Prefers the EMA weights (what Ultralytics evaluates and exports) when the file has them; released
    files keep them under ``"model"`` with ``"ema": None``.

    Raises:
        UnsafeCheckpointError: the file would import anything outside the allow-list.
        ValueError: the file is not a YOLOv8 detection checkpoint.
    """
    path = Path(path)
    checkpoint = load_checkpoint(path)
    if not isinstance(checkpoint, dict):
        checkpoint = {}  # reported below as having no model
    source = "ema" if checkpoint.get("ema") is not None else "model"
    network = checkpoint.get(source)
    if not isinstance(network, StandIn) or "model" not in (network.state.get("_modules") or {}):
        raise ValueError(f"{path}: not an Ultralytics checkpoint (no pickled model under 'ema' or 'model')")

    layers = list(network.state["_modules"]["model"].state.get("_modules", {}).values())
    layer_types = tuple(layer.class_name if isinstance(layer, StandIn) else "?" for layer in layers)
    expected = tuple(name for name, _ in YOLOV8_LAYERS)
    if layer_types != expected:
        first = next((i for i, (a, b) in enumerate(zip(layer_types, expected)) if a != b), len(expected))
        found = layer_types[first] if first < len(layer_types) else "nothing"
        want = expected[first] if first < len(expected) else "nothing"
        built_from = _yaml_file(network)
        raise ValueError(
            f"{path}: not a YOLOv8 detection model ({f'built from {built_from}: ' if built_from else ''}layer {first} "
            f"is {found}, expected {want}); only yolov8n/s/m/l/x detection weights are supported"
        )

    try:
        state_dict = stand_in_state_dict(network)
    except TypeError as error:  # a layer pickled as something other than a module
        raise ValueError(f"{path}: not a YOLOv8 detection model ({error})") from None
    for key in ("model.0.conv.weight", "model.22.cv3.0.2.bias"):  # what the scale and the class count come from
        if not isinstance(state_dict.get(key), torch.Tensor) or state_dict[key].ndim < 1:
            raise ValueError(f"{path}: not YOLOv8 detection weights (no tensor {key})")
    try:
        detect_yolov8_scale(state_dict)
    except ValueError as error:  # a custom width or depth: no scale of ours matches it
        raise ValueError(f"{path}: {error}; only yolov8n/s/m/l/x detection weights are supported") from None
    num_classes = state_dict["model.22.cv3.0.2.bias"].shape[0]  # the tensors, not metadata, decide what loads
    names = _read_names(network.state.get("names"))
    return UltralyticsCheckpoint(path, state_dict, layer_types, num_classes, names, source)


def _yaml_file(network: StandIn) -> str:
    """The architecture file the model was built from (``yolo11n.yaml``), as Ultralytics records it in the model's
    ``yaml`` dict: what tells a user which family the file is; "" when it has none."""
    spec = network.state.get("yaml")
    name = spec.get("yaml_file") if isinstance(spec, dict) else None
    return Path(name).name if isinstance(name, str) else ""


def _read_names(names: object) -> dict[int, str]:
    """Ultralytics stores class names as ``{0: "person", ...}`` (older files: a list)."""
    if isinstance(names, dict):
        return {int(index): str(name) for index, name in names.items()}
    if isinstance(names, (list, tuple)):
        return dict(enumerate(map(str, names)))
    return {}


def detect_yolov8_scale(ultra_state_dict: dict[str, torch.Tensor]) -> str:
    """``n s m l x`` from the stem width and the number of bottlenecks in layer 2.

    The stem width alone tells the scales apart; the depth check catches a custom YAML.
    """
    stem_width = ultra_state_dict["model.0.conv.weight"].shape[0]
    blocks = {key.split(".")[3] for key in ultra_state_dict if key.startswith("model.2.m.")}
    for scale, (depth, width, max_channels) in SCALES.items():
        # Same rounding as detector.model.yolo: widths up to a multiple of 8, depths to the nearest integer.
        if (stem_width, len(blocks)) == (math.ceil(min(64, max_channels) * width / 8) * 8, max(round(3 * depth), 1)):
            return scale
    raise ValueError(f"unrecognised YOLOv8 size: stem width {stem_width}, {len(blocks)} bottlenecks in layer 2")


def convert_yolov8_state_dict(
    ultra_state_dict: dict[str, torch.Tensor], *, scale: str | None = None
) -> dict[str, torch.Tensor]:
    """Ultralytics YOLOv8 keys (``model.<i>.rest``) -> our keys (``<attribute>.rest``), floats as float32.

    Args:
        ultra_state_dict: a flat Ultralytics state dict, e.g. ``UltralyticsCheckpoint.state_dict``.
        scale: if given, checked against the scale the tensor shapes imply.
    """
    found = detect_yolov8_scale(ultra_state_dict)
    if scale is not None and scale != found:
        raise ValueError(f"the weights are YOLOv8{found}, not YOLOv8{scale}")
    converted = {}
    for key, tensor in ultra_state_dict.items():
        match = _LAYER_KEY.fullmatch(key)
        layer = int(match.group(1)) if match else len(YOLOV8_LAYERS)
        attribute = YOLOV8_LAYERS[layer][1] if layer < len(YOLOV8_LAYERS) else None
        if attribute is None:
            raise ValueError(f"unexpected YOLOv8 tensor {key!r}")
        # Released files are FP16; training keeps FP32 masters and autocast decides the compute dtype.
        converted[f"{attribute}.{match.group(2)}"] = tensor.float() if tensor.is_floating_point() else tensor
    return converted


def load_pretrained(model: YOLO, weights: str | Path | UltralyticsCheckpoint,
                    names: Sequence[str] | None = None) -> LoadReport:
    """Copy YOLOv8 weights into ``model`` in place.

    With a different class count, every module of the classification branch (``head.cv3``) whose shape
    depends on it keeps its fresh initialisation: the final ``head.cv3.<i>.2`` convs, and the whole branch
    where the model's branch width is not the file's (build the model with ``class_channels=
    weights.class_channels`` to keep its hidden layers, as training does). Everything else must match exactly.
    With ``names`` (the model's classes), the final convs' rows of classes the file names alike are moved to
    those classes (:mod:`detector.weights.class_rows`), as Ultralytics 8.4 does.

    Args:
        model: built at the checkpoint's scale (see ``UltralyticsCheckpoint.scale``) with ``reg_max=16``.
        weights: a path, a bare name looked up in the repository's ``weights/`` folder, or a checkpoint
            already read by :func:`read_ultralytics_checkpoint`.
        names: the model's class names, one per class; ``None`` leaves the rows where they are.

    Raises:
        ValueError: the file is not YOLOv8 detection weights, or its scale or shapes do not fit ``model``.
    """
    if not isinstance(weights, UltralyticsCheckpoint):
        weights = read_ultralytics_checkpoint(resolve_weights(weights))
    path, scale = weights.path, weights.scale
    if scale != model.scale:
        raise ValueError(
            f"{path}: holds YOLOv8{scale} weights but the model is scale {model.scale!r}; build it with scale={scale!r}"
        )
    incoming = convert_yolov8_state_dict(weights.state_dict)
    own = model.state_dict()
    moved, named = moved_class_rows(incoming, own, weights.class_names, names) if names is not None else ({}, 0)
    misfits = [key for key in incoming.keys() | own.keys() if _shape(incoming, key) != _shape(own, key)]
    fresh = {_module_of(key) for key in misfits} - {""} if weights.num_classes != model.num_classes else set()
    wrong = sorted(key for key in misfits if _module_of(key) not in fresh)
    if wrong:
        details = ", ".join(f"{key} {_shape(incoming, key)} vs {_shape(own, key)}" for key in wrong[:3])
        raise ValueError(f"{path}: weights do not fit the model ({len(wrong)} tensors differ: {details})")

    # Whole modules (conv + its BN statistics) start fresh, so no half-loaded Conv-BN pair is left behind; the
    # moved class rows replace their convs' tensors (the rows without a name keep the fresh ones).
    kept = {key: tensor for key, tensor in incoming.items() if _module_of(key) not in fresh and key not in moved}
    model.load_state_dict(kept | moved, strict=False)  # the keys left out are exactly those under ``fresh``
    reinitialised = tuple(key for key in own if _module_of(key) in fresh and key not in moved)
    return LoadReport(path, scale, len(kept) + len(moved), reinitialised, model.num_classes, weights.num_classes,
                      weights.names, named)


def _module_of(key: str) -> str:
    """``"head.cv3.0.1.bn.weight"`` -> ``"head.cv3.0.1"``: the classification-branch module a key belongs to."""
    match = _CLASS_BRANCH.match(key)
    return match.group(1) if match else ""


def _shape(state_dict: dict[str, torch.Tensor], key: str) -> str:
    return str(tuple(state_dict[key].shape)) if key in state_dict else "absent"
