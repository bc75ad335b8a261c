"""The YOLOv8, YOLO11 and YOLO26 architectures as Ultralytics' yolov8.yaml, yolo11.yaml and yolo26.yaml write them
(their scales and layers), the model names built here, and a model YAML (``model=my/yolov8n.yaml``,
``model=yolo26n.yaml``) checked against them.

Only the standard detectors are built (detector/model/yolo.py, from :data:`FAMILY_SCALES`), at a scale letter. A file
a user edited (another backbone, head, activation or scale multipliers) would otherwise train a standard model under
its name, so a file is read and accepted only where it describes one of them; its ``nc`` is not read (the data YAML's
names set the classes). The layers below are Ultralytics' ``cfg/models/v8/yolov8.yaml``,
``cfg/models/11/yolo11.yaml`` and ``cfg/models/26/yolo26.yaml`` (8.4) as ``yaml.safe_load`` reads them. Imports
nothing of the package: the alias table (layer 1) reads it.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

# scale -> (depth multiplier, width multiplier, max channels), as in YOLOv8.
SCALES: dict[str, tuple[float, float, int]] = {
    "n": (0.33, 0.25, 1024),
    "s": (0.33, 0.50, 1024),
    "m": (0.67, 0.75, 768),
    "l": (1.00, 1.00, 512),
    "x": (1.00, 1.25, 512),
}
# YOLO11's, as Ultralytics' cfg/models/11/yolo11.yaml writes them.
YOLO11_SCALES: dict[str, tuple[float, float, int]] = {
    "n": (0.50, 0.25, 1024),
    "s": (0.50, 0.50, 1024),
    "m": (0.50, 1.00, 512),
    "l": (1.00, 1.00, 512),
    "x": (1.00, 1.50, 512),
}
# YOLO26's are YOLO11's (cfg/models/26/yolo26.yaml): the two families differ in layers, not in scaling.
YOLO26_SCALES: dict[str, tuple[float, float, int]] = dict(YOLO11_SCALES)
# What --model takes (and checkpoints keep as model_args' "scale"): a YOLOv8 scale letter alone, as before YOLO11
# was built (files written since stay readable by older versions), or a family's number and a letter ("11n",
# "26n"). An older version refuses "11n" or "26n" in one line (its check of model_args' scale) instead of building
# the wrong network.
YOLO11_PREFIX = "11"
YOLO26_PREFIX = "26"
FAMILY_SCALES: dict[str, dict[str, tuple[float, float, int]]] = {"v8": SCALES, "11": YOLO11_SCALES,
                                                                 "26": YOLO26_SCALES}
MODEL_NAMES: tuple[str, ...] = tuple(("" if family == "v8" else family) + letter
                                     for family, scales in FAMILY_SCALES.items() for letter in scales)
# Box regression per family: YOLOv8 and YOLO11 predict 16 DFL bins a box side, YOLO26 the distance itself (1).
REG_MAX: dict[str, int] = {"v8": 16, "11": 16, "26": 1}
# Families whose head has a second, one-to-one branch (trained beside the usual one; NMS-free inference).
END_TO_END_FAMILIES: frozenset[str] = frozenset({"26"})


def family_and_scale(name: str) -> tuple[str, str]:
    """``"n"`` -> ``("v8", "n")``, ``"11s"`` -> ``("11", "s")``, ``"26m"`` -> ``("26", "m")``: a model name's family
    and scale letter.

    Raises:
        ValueError: ``name`` is not one of :data:`MODEL_NAMES`.
    """
    if name not in MODEL_NAMES:
        raise ValueError(f"unknown model {name!r}; choose one of {' '.join(MODEL_NAMES)}")
    return (name[:-1], name[-1]) if len(name) > 1 else ("v8", name)


def model_name(family: str, letter: str) -> str:
    """``("v8", "n")`` -> ``"n"``, ``("11", "s")`` -> ``"11s"``: :func:`family_and_scale` the other way."""
    return ("" if family == "v8" else family) + letter


def display_name(name: str) -> str:
    """``"n"`` -> ``"YOLOv8n"``, ``"11n"`` -> ``"YOLO11n"``, ``"26n"`` -> ``"YOLO26n"``: as Ultralytics names it."""
    family, scale = family_and_scale(name)
    return f"{family_name(family)}{scale}"


BACKBONE: list[list[Any]] = [
    [-1, 1, "Conv", [64, 3, 2]],
    [-1, 1, "Conv", [128, 3, 2]],
    [-1, 3, "C2f", [128, True]],
    [-1, 1, "Conv", [256, 3, 2]],
    [-1, 6, "C2f", [256, True]],
    [-1, 1, "Conv", [512, 3, 2]],
    [-1, 6, "C2f", [512, True]],
    [-1, 1, "Conv", [1024, 3, 2]],
    [-1, 3, "C2f", [1024, True]],
    [-1, 1, "SPPF", [1024, 5]],
]
HEAD: list[list[Any]] = [
    [-1, 1, "nn.Upsample", ["None", 2, "nearest"]],
    [[-1, 6], 1, "Concat", [1]],
    [-1, 3, "C2f", [512]],
    [-1, 1, "nn.Upsample", ["None", 2, "nearest"]],
    [[-1, 4], 1, "Concat", [1]],
    [-1, 3, "C2f", [256]],
    [-1, 1, "Conv", [256, 3, 2]],
    [[-1, 12], 1, "Concat", [1]],
    [-1, 3, "C2f", [512]],
    [-1, 1, "Conv", [512, 3, 2]],
    [[-1, 9], 1, "Concat", [1]],
    [-1, 3, "C2f", [1024]],
    [[15, 18, 21], 1, "Detect", ["nc"]],
]
YOLO11_BACKBONE: list[list[Any]] = [
    [-1, 1, "Conv", [64, 3, 2]],
    [-1, 1, "Conv", [128, 3, 2]],
    [-1, 2, "C3k2", [256, False, 0.25]],
    [-1, 1, "Conv", [256, 3, 2]],
    [-1, 2, "C3k2", [512, False, 0.25]],
    [-1, 1, "Conv", [512, 3, 2]],
    [-1, 2, "C3k2", [512, True]],
    [-1, 1, "Conv", [1024, 3, 2]],
    [-1, 2, "C3k2", [1024, True]],
    [-1, 1, "SPPF", [1024, 5]],
    [-1, 2, "C2PSA", [1024]],
]
YOLO11_HEAD: list[list[Any]] = [
    [-1, 1, "nn.Upsample", ["None", 2, "nearest"]],
    [[-1, 6], 1, "Concat", [1]],
    [-1, 2, "C3k2", [512, False]],
    [-1, 1, "nn.Upsample", ["None", 2, "nearest"]],
    [[-1, 4], 1, "Concat", [1]],
    [-1, 2, "C3k2", [256, False]],
    [-1, 1, "Conv", [256, 3, 2]],
    [[-1, 13], 1, "Concat", [1]],
    [-1, 2, "C3k2", [512, False]],
    [-1, 1, "Conv", [512, 3, 2]],
    [[-1, 10], 1, "Concat", [1]],
    [-1, 2, "C3k2", [1024, True]],
    [[16, 19, 22], 1, "Detect", ["nc"]],
]
# YOLO26 is YOLO11 with three layers changed: SPPF with a residual connection and an unactivated first convolution
# (Ultralytics reads a fourth argument as that), attention blocks in the last neck C3k2, and an NMS-free head.
YOLO26_BACKBONE: list[list[Any]] = [*YOLO11_BACKBONE[:9], [-1, 1, "SPPF", [1024, 5, 3, True]], YOLO11_BACKBONE[10]]
YOLO26_HEAD: list[list[Any]] = [
    [-1, 1, "nn.Upsample", ["None", 2, "nearest"]],
    [[-1, 6], 1, "Concat", [1]],
    [-1, 2, "C3k2", [512, True]],
    [-1, 1, "nn.Upsample", ["None", 2, "nearest"]],
    [[-1, 4], 1, "Concat", [1]],
    [-1, 2, "C3k2", [256, True]],
    [-1, 1, "Conv", [256, 3, 2]],
    [[-1, 13], 1, "Concat", [1]],
    [-1, 2, "C3k2", [512, True]],
    [-1, 1, "Conv", [512, 3, 2]],
    [[-1, 10], 1, "Concat", [1]],
    [-1, 1, "C3k2", [1024, True, 0.5, True]],
    [[16, 19, 22], 1, "Detect", ["nc"]],
]
# Each family's (backbone, head), by its name in family_and_scale; the head's last layer is Detect, whose index
# (HEAD_LAYER: 22 in YOLOv8, 23 in YOLO11 and YOLO26) --freeze counts up to.
FAMILY_LAYERS: dict[str, tuple[list[list[Any]], list[list[Any]]]] = {"v8": (BACKBONE, HEAD),
                                                                      "11": (YOLO11_BACKBONE, YOLO11_HEAD),
                                                                      "26": (YOLO26_BACKBONE, YOLO26_HEAD)}
HEAD_LAYER: dict[str, int] = {family: len(backbone + head) - 1 for family, (backbone, head) in FAMILY_LAYERS.items()}
# Other top-level keys Ultralytics reads that change the model, at the values that leave it standard (for YOLO26,
# its file's reg_max: 1 and end2end: True, or those keys left out: then the head is YOLOv8's, not YOLO26's).
_SHARED_KEYS: dict[str, tuple[Any, ...]] = {"activation": (None, "nn.SiLU()"), "ch": (None, 3)}
STANDARD_KEYS: dict[str, dict[str, tuple[Any, ...]]] = {
    family: {**_SHARED_KEYS, "reg_max": (REG_MAX[family],) if family in END_TO_END_FAMILIES else (None, 16),
             "end2end": (True,) if family in END_TO_END_FAMILIES else (None, False)}
    for family in FAMILY_LAYERS}
SCALE_IN_NAME = re.compile(r"yolo(e-)?v?\d+([nslmx])")  # Ultralytics' guess_model_scale


def family_name(family: str) -> str:
    """``"v8"`` -> ``"YOLOv8"``, ``"11"`` -> ``"YOLO11"``, ``"26"`` -> ``"YOLO26"``."""
    return f"YOLO{family}"


def custom(what: str) -> ValueError:
    return ValueError(f"a custom architecture ({what}); only the standard YOLOv8, YOLO11 and YOLO26 n/s/m/l/x are "
                      "built here")


def effective(depth: float, width: float, max_channels: float,
              family: str = "v8") -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The repeats and channel counts a ``[depth, width, max_channels]`` gives a family's layers, as Ultralytics'
    parse_model computes them (detector/model/yolo.py builds from these): YOLOv8 repeats 3 and 6 blocks, YOLO11 and
    YOLO26 2."""
    repeats = tuple(max(round(n * depth), 1) for n in ((3, 6) if family == "v8" else (2,)))
    channels = tuple(int(math.ceil(min(c, max_channels) * width / 8) * 8) for c in (64, 128, 256, 512, 1024))
    return repeats, channels


def normalised(layer: Any) -> Any:
    """The Detect layer's class count as ``nc`` whatever the file writes there: the data YAML sets it here."""
    if isinstance(layer, list) and len(layer) == 4 and layer[2] == "Detect" and isinstance(layer[3], list) \
            and len(layer[3]) == 1 and (layer[3][0] == "nc" or isinstance(layer[3][0], int)):
        return [*layer[:3], ["nc"]]
    return layer


def standard_scale(path: str) -> tuple[str, str]:
    """``(model name, note)`` of the model YAML at ``path``: ``n`` ... ``x`` for YOLOv8's layers, ``11n`` ... ``11x``
    for YOLO11's, ``26n`` ... ``26x`` for YOLO26's, at the scale Ultralytics picks (the letter in the file's name,
    else the first of its ``scales``, else the one its ``depth_multiple``/``width_multiple`` give), and what the note
    should add (its ``nc`` is not read; a scale picked without a letter in the name).

    Raises:
        ValueError: the file cannot be read, or describes another architecture; one line that does not name the
        file: its one caller, the ``model=`` alias, prefixes ``model='PATH':`` (a second mention said it twice).
    """
    import yaml

    try:
        spec = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise ValueError(f"cannot be read as a model YAML ({str(error).splitlines()[0]})") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("backbone"), list) \
            or not isinstance(spec.get("head"), list):
        raise ValueError("not a model YAML (expected backbone: and head: lists, as in yolov8.yaml)")
    family = family_of_layers([normalised(layer) for layer in spec["backbone"] + spec["head"]], len(spec["backbone"]))
    for key, standard in STANDARD_KEYS[family].items():
        if spec.get(key) not in standard:
            raise custom(f"{key}: {spec.get(key)!r}")
    letter, note = scale_of(path, spec, family)
    nc = spec.get("nc")
    unread = f"; its nc: {nc} is not read, the data YAML's names set the classes" if nc else ""
    return model_name(family, letter), note + unread


def family_of_layers(layers: list[Any], backbone: int) -> str:
    """The family whose layers these are (``backbone``: how many of them the file's ``backbone:`` holds).

    Raises:
        ValueError: they are neither family's, said against the one they follow longest (:func:`custom`).
    """
    def agreeing(family: str) -> int:
        standard = FAMILY_LAYERS[family][0] + FAMILY_LAYERS[family][1]
        return next((index for index, (theirs, ours) in enumerate(zip(layers, standard)) if theirs != ours),
                    min(len(layers), len(standard)))

    closest = max(FAMILY_LAYERS, key=agreeing)  # a tie (layers 0-1 alike, 2 neither): YOLOv8, the first
    standard_backbone, standard_head = FAMILY_LAYERS[closest]
    if agreeing(closest) < min(len(layers), len(standard_backbone + standard_head)):
        raise custom(f"layer {agreeing(closest)} differs")
    if len(layers) != len(standard_backbone + standard_head):
        raise custom(f"{len(layers)} layers, not {len(standard_backbone + standard_head)}")
    if backbone != len(standard_backbone):
        raise custom(f"a backbone of {backbone} layers, not {len(standard_backbone)}")
    return closest


def scale_of(path: str, spec: dict[str, Any], family: str = "v8") -> tuple[str, str]:
    """The scale letter whose repeats and widths ``spec``'s multipliers give in ``family``, and a note on how it was
    chosen. YOLO11's C3k blocks come with the scale Ultralytics picked (m, l or x), not with the multipliers."""
    named = SCALE_IN_NAME.search(Path(path).stem.lower())
    scales = spec.get("scales")
    standards, title = FAMILY_SCALES[family], family_name(family)
    if scales:
        if not isinstance(scales, dict) or not all(isinstance(v, list) and len(v) == 3 for v in scales.values()):
            raise ValueError("scales: expected letter: [depth, width, max_channels] entries")
        letter = named.group(2) if named else str(next(iter(scales)))
        how = "" if named else f"; no scale letter in its name: the first of its scales, {letter}, as in Ultralytics"
        if letter not in scales:
            raise ValueError(f"its name asks for scale {letter}, which its scales do not list")
        multipliers = tuple(scales[letter])
    else:
        letter, how = "", ""
        multipliers = (spec.get("depth_multiple", 1.0), spec.get("width_multiple", 1.0), math.inf)
    try:
        built = effective(*(float(value) for value in multipliers), family)
    except (TypeError, ValueError):
        raise ValueError(f"scale multipliers {list(multipliers)} are not numbers") from None
    if letter:
        if letter not in standards or built != effective(*standards[letter], family):
            raise custom(f"scale {letter}: {list(multipliers)}, not {title}{letter}'s {list(standards[letter])}")
        return letter, how
    # Without scales, Ultralytics still takes the letter in the name as the scale, and YOLO11 has C3k blocks then.
    c3k = bool(named) and named.group(2) in "mlx"
    matching = [scale for scale, standard in standards.items() if built == effective(*standard, family)
                and (family == "v8" or (scale in "mlx") == c3k)]
    if not matching:
        raise custom(f"depth_multiple {multipliers[0]}, width_multiple {multipliers[1]} match no {title} scale")
    return matching[0], ""
