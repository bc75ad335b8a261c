"""Start from Ultralytics YOLOv8, YOLO11 and YOLO26 detection weights (``yolov8n.pt`` ... ``yolov8x.pt``,
``yolo11n.pt`` ... ``yolo11x.pt``, ``yolo26n.pt`` ... ``yolo26x.pt``, and models fine-tuned from them).

Those files pickle Ultralytics' own classes. We never import ``ultralytics`` (it is AGPL-3.0) and never
run code from the file: :mod:`detector.weights.safe_pickle` reads it into inert stand-ins, and this module
walks them for tensors, renames the layer indices (``model.4.``) to our attribute names (``stage3.``) by the
family's layer table (:data:`YOLOV8_LAYERS`, :data:`YOLO11_LAYERS`, :data:`YOLO26_LAYERS`) and copies the result
into a :class:`~detector.model.YOLO`. A file is taken only where every tensor has the name and shape of ours at the
scale its shapes give. YOLO26's layer types are YOLO11's; its head's one-to-one branch (``one2one_cv2``,
``one2one_cv3``) tells the two apart (:func:`family_of`).

Typical use::

    checkpoint = read_ultralytics_checkpoint(resolve_weights("yolo11n.pt"))
    model = build_model(num_classes=3, scale=checkpoint.scale, class_channels=checkpoint.class_channels)
    report = load_pretrained(model, checkpoint, names=["cat", "dog", "person"])
    print(report.summary())
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from detector.aliases import other_ultralytics_family
from detector.architecture import (END_TO_END_FAMILIES, FAMILY_SCALES, HEAD_LAYER, display_name, effective,
                                   family_name, model_name)
from detector.model.head import class_width_key
from detector.model.yolo import YOLO, build_model
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
# YOLO11's (Ultralytics' cfg/models/11/yolo11.yaml): C3k2 blocks, and C2PSA attention as layer 10, which moves the
# neck and the head (23) one index on.
YOLO11_LAYERS: tuple[tuple[str, str | None], ...] = (
    ("Conv", "stem"),  # 0
    ("Conv", "down2"),
    ("C3k2", "stage2"),
    ("Conv", "down3"),
    ("C3k2", "stage3"),
    ("Conv", "down4"),  # 5
    ("C3k2", "stage4"),
    ("Conv", "down5"),
    ("C3k2", "stage5"),
    ("SPPF", "sppf"),
    ("C2PSA", "psa"),  # 10
    ("Upsample", None),
    ("Concat", None),
    ("C3k2", "top_down4"),
    ("Upsample", None),
    ("Concat", None),  # 15
    ("C3k2", "top_down3"),
    ("Conv", "bottom_up_down3"),
    ("Concat", None),
    ("C3k2", "bottom_up4"),
    ("Conv", "bottom_up_down4"),  # 20
    ("Concat", None),
    ("C3k2", "bottom_up5"),
    ("Detect", "head"),
)
# YOLO26's (cfg/models/26/yolo26.yaml) has YOLO11's layers by type and index: what differs is inside them (SPPF's
# residual, attention blocks in layer 22's C3k2, the head's one-to-one branch and 4 box channels), and our modules
# have the same names for those, so the table is YOLO11's.
YOLO26_LAYERS: tuple[tuple[str, str | None], ...] = YOLO11_LAYERS
# Each family's table, by its name in detector.architecture.family_and_scale.
LAYERS: dict[str, tuple[tuple[str, str | None], ...]] = {"v8": YOLOV8_LAYERS, "11": YOLO11_LAYERS,
                                                         "26": YOLO26_LAYERS}
_LAYER_KEY = re.compile(r"model\.(\d+)\.(.+)")
# A module of the classification branch: its widths depend on the class count, so it is re-initialised when they
# differ. The module is the innermost numbered one: ``head.cv3.0.1`` (YOLOv8: a Conv), ``head.cv3.0.0.1`` (YOLO11:
# the 1x1 Conv after a depthwise one, which keeps its input's width and so loads), ``head.cv3.0.2`` (the logits);
# YOLO26's one-to-one class branch (``head.one2one_cv3``) is a copy of ``head.cv3`` and goes the same way.
_CLASS_BRANCH = re.compile(r"(head\.(?:one2one_)?cv3(?:\.\d+)+)\.")
SUPPORTED = "only YOLOv8, YOLO11 and YOLO26 n/s/m/l/x detection weights are supported"


def family_of(layer_types: tuple[str, ...], ultra_state_dict: dict[str, torch.Tensor]) -> str | None:
    """The family whose layer table the file's layer types are (None: none's). YOLO11 and YOLO26 have the same
    types: a YOLO26 head holds a one-to-one branch (``model.23.one2one_cv2.*``), which no YOLO11 has; where the
    types match but the branch does not (a YOLO26 file built with ``end2end: False``), the first family matching
    by types is returned and the shape check names what differs."""
    matching = [family for family, table in LAYERS.items() if layer_types == _types(table)]
    end_to_end = _has_one_to_one(ultra_state_dict)
    return next((family for family in matching if (family in END_TO_END_FAMILIES) == end_to_end),
                matching[0] if matching else None)


def family_of_keys(ultra_state_dict: dict[str, torch.Tensor]) -> str:
    """The family from the tensors' names alone: ``"v8"`` where the Detect layer is layer 22, else (layer 23, after
    YOLO11's C2PSA) ``"26"`` with a one-to-one branch in the head, ``"11"`` without."""
    if not any(key.startswith(f"model.{HEAD_LAYER['11']}.") for key in ultra_state_dict):
        return "v8"
    return "26" if _has_one_to_one(ultra_state_dict) else "11"


def _has_one_to_one(ultra_state_dict: dict[str, torch.Tensor]) -> bool:
    """Whether the Detect layer (23: YOLO26's, as YOLO11's) has the one-to-one branch of an end-to-end head."""
    prefix = f"model.{HEAD_LAYER['26']}.one2one_"
    return any(key.startswith(prefix) for key in ultra_state_dict)


def _head_key(family: str, rest: str) -> str:
    return f"model.{HEAD_LAYER[family]}.{rest}"


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
    def family(self) -> str:
        """``"v8"``, ``"11"`` or ``"26"``, from the layers' types and (YOLO11 or YOLO26) the head's branches."""
        family = family_of(self.layer_types, self.state_dict)
        if family is None:
            raise ValueError(f"{self.path}: no family has these layers")
        return family

    @property
    def scale(self) -> str:
        """Our model name (``n`` ... ``x``, ``11n`` ... ``11x``, ``26n`` ... ``26x``), read from tensor shapes."""
        return detect_scale(self.state_dict, self.family)

    @property
    def class_channels(self) -> int:
        """The class branch's hidden width. Not always the default for the class count: Ultralytics 8.4 keeps the
        width of the weights a model was fine-tuned from (a 3-class nano from ``yolov8n.pt`` is 80 wide). YOLO11's
        and YOLO26's branch opens with a depthwise conv at its input's width, so the width is that of the 1x1 conv
        after it."""
        return _class_width(self.state_dict, self.family)

    @property
    def class_names(self) -> list[str]:
        """One name per class, the index where the file has none."""
        return [self.names.get(index, str(index)) for index in range(self.num_classes)]


def _types(layers: tuple[tuple[str, str | None], ...]) -> tuple[str, ...]:
    return tuple(kind for kind, _ in layers)


def _class_width(ultra_state_dict: dict[str, torch.Tensor], family: str) -> int:
    return int(ultra_state_dict[_head_key(family, class_width_key(depthwise=family != "v8"))].shape[0])


@dataclass(frozen=True)
class LoadReport:
    """What :func:`load_pretrained` did."""

    path: Path
    scale: str  # our model name: "n", "11n", ...
    matched: int  # tensors copied from the checkpoint
    reinitialised: tuple[str, ...]  # model keys left at their fresh initialisation
    num_classes: int  # the model's
    source_num_classes: int  # the checkpoint's
    source_names: dict[int, str] = field(default_factory=dict)
    named: int = 0  # the model's classes whose logit rows came from the weights' class of the same name

    def summary(self) -> str:
        """One line for logs."""
        line = (f"loaded {self.matched} tensors from {self.path} ({display_name(self.scale)}, "
                f"{self.source_num_classes} classes)")
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
    """Read an Ultralytics ``.pt`` YOLOv8, YOLO11 or YOLO26 detection checkpoint without importing ultralytics or
    running its code.

    Prefers the EMA weights (what Ultralytics evaluates and exports) when the file has them; released
    files keep them under ``"model"`` with ``"ema": None``.

    Raises:
        UnsafeCheckpointError: the file would import anything outside the allow-list.
        ValueError: the file is not a YOLOv8, YOLO11 or YOLO26 detection checkpoint of a standard scale.
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
    by_types = family_of(layer_types, {})  # YOLO11's or YOLO26's layers: the tensors below tell which
    if by_types is None:
        raise ValueError(f"{path}: {_layout_problem(layer_types, _yaml_file(network))}")
    try:
        state_dict = stand_in_state_dict(network)
    except TypeError as error:  # a layer pickled as something other than a module
        raise ValueError(f"{path}: not a {family_name(by_types)} detection model ({error})") from None
    family = family_of(layer_types, state_dict) or by_types
    title = family_name(family)
    for key in ("model.0.conv.weight", _head_key(family, "cv3.0.2.bias")):  # the scale and the class count
        if not isinstance(state_dict.get(key), torch.Tensor) or state_dict[key].ndim < 1:
            raise ValueError(f"{path}: not {title} detection weights (no tensor {key})")
    try:
        scale = detect_scale(state_dict, family)
    except ValueError as error:  # a custom width or depth: no scale of ours matches it
        raise ValueError(f"{path}: {error}; {SUPPORTED}") from None
    num_classes = state_dict[_head_key(family, "cv3.0.2.bias")].shape[0]  # the tensors, not metadata, decide
    if problem := _shape_problem(state_dict, scale, num_classes, family):
        built_from = _yaml_file(network)  # yolo26n.yaml: "built from yolo26n.yaml, YOLO26: "
        other = other_ultralytics_family(built_from) if built_from else None
        built = f"built from {built_from}{f', {other}' if other else ''}: " if built_from else ""
        raise ValueError(f"{path}: not a standard {display_name(scale)} detection model ({built}{problem}); "
                         f"{SUPPORTED}")
    names = _read_names(network.state.get("names"))
    return UltralyticsCheckpoint(path, state_dict, layer_types, num_classes, names, source)


def _layout_problem(layer_types: tuple[str, ...], built_from: str) -> str:
    """Why the layers are neither family's: the first that differs from the family they follow longest."""
    def agreeing(expected: tuple[str, ...]) -> int:
        return next((index for index, (found, want) in enumerate(zip(layer_types, expected)) if found != want),
                    min(len(layer_types), len(expected)))

    expected = max((_types(table) for table in LAYERS.values()), key=agreeing)  # a tie: YOLOv8's, the first
    first = agreeing(expected)
    found = layer_types[first] if first < len(layer_types) else "nothing"
    want = expected[first] if first < len(expected) else "nothing"
    built = f"built from {built_from}: " if built_from else ""
    return (f"not a YOLOv8, YOLO11 or YOLO26 detection model ({built}layer {first} is {found}, expected {want}); "
            f"{SUPPORTED}")


def _shape_problem(ultra_state_dict: dict[str, torch.Tensor], scale: str, num_classes: int, family: str) -> str:
    """What differs between the file's tensors and our model's at ``scale`` (names and shapes; "" when nothing):
    the layer types alone let through files whose blocks are configured otherwise (a YOLO26 head without its
    one-to-one branch: 4 box channels where YOLO11 has 64). The model is built on the meta device, at the family's
    ``reg_max`` (16, YOLO26's 1): no memory, no initialisation."""
    try:
        width = _class_width(ultra_state_dict, family)
        theirs = convert_state_dict(ultra_state_dict)
    except KeyError as missing:  # no class branch where the family has it
        return f"no tensor {missing}"
    except ValueError as error:  # a tensor of a parameter-free layer
        return str(error)
    with torch.device("meta"):
        ours = build_model(num_classes=num_classes, scale=scale, class_channels=width).state_dict()
    differ = sorted(key for key in ours.keys() | theirs.keys() if _shape(ours, key) != _shape(theirs, key))
    details = ", ".join(f"{key} {_shape(theirs, key)}, ours {_shape(ours, key)}" for key in differ[:2])
    return f"{len(differ)} tensors differ from ours: {details}" if differ else ""


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


def detect_scale(ultra_state_dict: dict[str, torch.Tensor], family: str | None = None) -> str:
    """Our model name (``n`` ... ``x``, ``11n`` ... ``11x``, ``26n`` ... ``26x``) from the stem width, the number of
    blocks in layer 2 and (YOLO11, YOLO26) whether they are C3k blocks; ``family`` default: :func:`family_of_keys`.

    The stem width alone tells YOLOv8's scales apart, the depth check catches a custom YAML. YOLO11's m and l share
    the stem width (64) and differ in depth (1 block, 2); its n and s (Bottleneck blocks) differ from m, l and x
    (C3k blocks, which hold bottlenecks of their own under ``m``) in the blocks' kind. YOLO26 scales as YOLO11.
    """
    family = family or family_of_keys(ultra_state_dict)
    stem_width = ultra_state_dict["model.0.conv.weight"].shape[0]
    blocks = {key.split(".")[3] for key in ultra_state_dict if key.startswith("model.2.m.")}
    c3k = any(key.startswith("model.2.m.0.m.") for key in ultra_state_dict)
    for letter, multipliers in FAMILY_SCALES[family].items():
        repeats, channels = effective(*multipliers, family)  # layer 2's repeats first, the stem's width first
        if (stem_width, len(blocks), c3k) == (channels[0], repeats[0], family != "v8" and letter in "mlx"):
            return model_name(family, letter)
    kind = "C3k blocks" if c3k else "bottlenecks"
    raise ValueError(f"unrecognised {family_name(family)} size: stem width {stem_width}, {len(blocks)} {kind} in "
                     "layer 2")


def convert_state_dict(ultra_state_dict: dict[str, torch.Tensor], *,
                       scale: str | None = None) -> dict[str, torch.Tensor]:
    """Ultralytics keys (``model.<i>.rest``) -> our keys (``<attribute>.rest``) by the family's layer table, floats
    as float32.

    Args:
        ultra_state_dict: a flat Ultralytics YOLOv8, YOLO11 or YOLO26 state dict, e.g.
            ``UltralyticsCheckpoint.state_dict`` (YOLO26's ``model.23.one2one_cv2.*`` -> ``head.one2one_cv2.*``).
        scale: our model name; if given, checked against the one the tensor shapes imply.
    """
    family = family_of_keys(ultra_state_dict)
    found = detect_scale(ultra_state_dict, family)
    if scale is not None and scale != found:
        raise ValueError(f"the weights are {display_name(found)}, not {scale!r}")
    table = LAYERS[family]
    converted = {}
    for key, tensor in ultra_state_dict.items():
        match = _LAYER_KEY.fullmatch(key)
        layer = int(match.group(1)) if match else len(table)
        attribute = table[layer][1] if layer < len(table) else None
        if attribute is None:
            raise ValueError(f"unexpected {family_name(family)} tensor {key!r}")
        # Released files are FP16; training keeps FP32 masters and autocast decides the compute dtype.
        converted[f"{attribute}.{match.group(2)}"] = tensor.float() if tensor.is_floating_point() else tensor
    return converted
def load_pretrained(model: YOLO, weights: str | Path | UltralyticsCheckpoint,
                    names: Sequence[str] | None = None) -> LoadReport:
    """Copy YOLOv8, YOLO11 or YOLO26 weights into ``model`` in place.

    With a different class count, every module of the classification branch (``head.cv3``, and YOLO26's one-to-one
    copy ``head.one2one_cv3`` alike) whose shape depends on it keeps its fresh initialisation: the final
    ``head.cv3.<i>.2`` convs, and the branch's hidden layers where the model's branch width is not the file's
    (YOLOv8: the whole branch; YOLO11, YOLO26: all but the depthwise conv on the branch's input) (build the model
    with ``class_channels=weights.class_channels`` to keep its hidden layers, as training does). Everything else must
    match exactly.
    With ``names`` (the model's classes), the final convs' rows of classes the file names alike are moved to
    those classes (:mod:`detector.weights.class_rows`), as Ultralytics 8.4 does.

    Args:
        model: built at the checkpoint's scale (see ``UltralyticsCheckpoint.scale``) with its family's ``reg_max``
            (build_model's default: 16, YOLO26's 1).
        weights: a path, a bare name looked up in the repository's ``weights/`` folder, or a checkpoint
            already read by :func:`read_ultralytics_checkpoint`.
        names: the model's class names, one per class; ``None`` leaves the rows where they are.

    Raises:
        ValueError: the file is not YOLOv8, YOLO11 or YOLO26 detection weights, or its scale or shapes do not fit
            ``model``.
    """
    if not isinstance(weights, UltralyticsCheckpoint):
        weights = read_ultralytics_checkpoint(resolve_weights(weights))
    path, scale = weights.path, weights.scale
    if scale != model.scale:
        raise ValueError(
            f"{path}: holds {display_name(scale)} weights but the model is scale {model.scale!r}; build it with "
            f"scale={scale!r}"
        )
    incoming = convert_state_dict(weights.state_dict)
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
    """``"head.cv3.0.1.bn.weight"`` -> ``"head.cv3.0.1"``, ``"head.cv3.0.0.1.conv.weight"`` -> ``"head.cv3.0.0.1"``,
    ``"head.one2one_cv3.0.2.bias"`` -> ``"head.one2one_cv3.0.2"``: the classification-branch module a key belongs
    to ("" for any other key)."""
    match = _CLASS_BRANCH.match(key)
    return match.group(1) if match else ""


def _shape(state_dict: dict[str, torch.Tensor], key: str) -> str:
    return str(tuple(state_dict[key].shape)) if key in state_dict else "absent"
