"""The search space of ``detector tune``: which of train's settings evolve, between which bounds, how far a step goes.

A space maps our :class:`~detector.training.config.TrainConfig` names to ``(low, high)`` or ``(low, high, gain)``:
a mutation steps a setting by a Gaussian of ``sigma * gain`` in the space normalised to [0, 1]
(detector/workflows/tune_mutation.py). :data:`DEFAULT_SPACE` holds the settings Ultralytics 8.4's tuner evolves that
this trainer has, with its bounds; ``--space file.yaml`` replaces it, in our names or Ultralytics' (``box`` ->
``box_gain``, through detector/aliases.py).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, NamedTuple

from detector.aliases import TABLES
from detector.options import field_type
from detector.training.config import TrainConfig


class Bounds(NamedTuple):
    low: float
    high: float
    gain: float = 1.0


# Ultralytics 8.4's default space (engine/tuner.py), in our names. Left out, as this trainer has no equivalent:
# copy_paste (segmentation only).
DEFAULT_SPACE: dict[str, Bounds] = {
    "lr0": Bounds(1e-5, 1e-2),
    "lrf": Bounds(0.01, 1.0),
    "momentum": Bounds(0.7, 0.98, 0.3),  # a third of the step: momentum near 1 is sensitive
    "weight_decay": Bounds(0.0, 0.001),
    "warmup_epochs": Bounds(0.0, 5.0),
    "warmup_momentum": Bounds(0.0, 0.95),
    "box_gain": Bounds(1.0, 20.0),
    "cls_gain": Bounds(0.1, 4.0),
    "cls_pw": Bounds(0.0, 1.0),
    "dfl_gain": Bounds(0.4, 12.0),
    "hsv_h": Bounds(0.0, 0.1),
    "hsv_s": Bounds(0.0, 0.9),
    "hsv_v": Bounds(0.0, 0.9),
    "degrees": Bounds(0.0, 45.0),
    "translate": Bounds(0.0, 0.9),
    "scale": Bounds(0.0, 0.95),
    "shear": Bounds(0.0, 10.0),
    "perspective": Bounds(0.0, 0.001),
    "flipud": Bounds(0.0, 1.0),
    "fliplr": Bounds(0.0, 1.0),
    "bgr": Bounds(0.0, 1.0),
    "mosaic": Bounds(0.0, 1.0),
    "mixup": Bounds(0.0, 1.0),
    "cutmix": Bounds(0.0, 1.0),
    "close_mosaic": Bounds(0, 10),
}

# Numbers of train's that are not hyperparameters to evolve: the run's length and seed (every iteration trains the
# same recipe with the same seed, so that fitness compares the settings alone), its plumbing, and the validation's
# own thresholds (tuning val_conf or max_det would move the yardstick, not the model).
NOT_TUNABLE = frozenset({"epochs", "seed", "workers", "batch", "batch_memory", "save_period", "val_interval",
                         "patience", "val_conf", "val_iou", "max_det", "fraction", "imgsz", "freeze"})


def tunable(name: str) -> bool:
    """Whether ``name`` is a TrainConfig number a space may name."""
    known = {item.name for item in dataclasses.fields(TrainConfig)}
    return name in known and name not in NOT_TUNABLE and field_type(TrainConfig, name)[0] in (int, float)


def is_integer(name: str) -> bool:
    """Whether the setting takes whole numbers (``close_mosaic``): its mutations are rounded to integers."""
    return field_type(TrainConfig, name)[0] is int


def our_name(name: str, where: str) -> str:
    """``name`` in our spelling (Ultralytics' ``box`` -> ``box_gain``); ``ValueError`` in one line naming it when it
    is not a number train takes that a tune may evolve."""
    alias = TABLES["train"].get(name)
    if alias is not None and alias.means is None:
        raise ValueError(f"{where}: Ultralytics' {name!r} has no equivalent here ({alias.says}); leave it out")
    ours = name
    if alias is not None:
        try:
            mapped = alias.means(1.0)
        except (TypeError, ValueError):
            mapped = {}
        ours = next(iter(mapped)) if len(mapped) == 1 else name
    if not tunable(ours):
        shown = f"{name!r} ({ours})" if ours != name else repr(name)
        raise ValueError(f"{where}: {shown} is not a number train takes that a tune evolves; the tunable ones are "
                         f"train's numeric settings but {', '.join(sorted(NOT_TUNABLE))}")
    return ours


def bounds_of(value: Any, where: str) -> Bounds:
    """``[low, high]`` or ``[low, high, gain]`` (a list or tuple of numbers, low <= high, gain >= 0) -> Bounds."""
    numbers = isinstance(value, (list, tuple)) and all(
        isinstance(item, (int, float)) and not isinstance(item, bool) and math.isfinite(item) for item in value)
    if not numbers or len(value) not in (2, 3):
        raise ValueError(f"{where}: expected [low, high] or [low, high, gain], got {value!r}")
    bounds = Bounds(*(float(item) for item in value))
    if bounds.low > bounds.high or bounds.gain < 0:
        raise ValueError(f"{where}: expected low <= high and a gain of 0 or more, got {value!r}")
    return bounds


def space_from(values: dict[Any, Any], source: str) -> dict[str, Bounds]:
    """A space from a mapping in our names or Ultralytics' (``source`` names it in the errors)."""
    if not isinstance(values, dict) or not values:
        raise ValueError(f"{source}: expected 'name: [low, high]' lines, found "
                         f"{type(values).__name__ if values else 'nothing'}")
    space: dict[str, Bounds] = {}
    for key, value in values.items():
        name = our_name(str(key), f"{source}: {key}")
        if name in space:
            raise ValueError(f"{source}: {key} and another key both name {name}; give one")
        bounds = bounds_of(value, f"{source}: {key}")
        if is_integer(name):
            low, high = math.ceil(bounds.low), math.floor(bounds.high)
            if low > high:
                raise ValueError(f"{source}: {key}: no whole number lies in [{bounds.low:g}, {bounds.high:g}]")
            bounds = Bounds(low, high, bounds.gain)
        space[name] = bounds
    return space


def read_space(path: str | Path) -> dict[str, Bounds]:
    """``--space file.yaml``; ``ValueError`` in one line for a file that cannot be read or a key not tunable."""
    import yaml

    try:
        loaded = yaml.safe_load(Path(path).expanduser().read_text(encoding="utf-8"))
    except OSError as error:
        raise ValueError(f"--space {path}: cannot read it ({error.strerror or error})") from None
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise ValueError(f"--space {path}: not a YAML file ({str(error).splitlines()[0]})") from None
    return space_from(loaded, f"--space {path}")


def check_against_train(space: dict[str, Bounds], config: TrainConfig) -> None:
    """Refuse bounds train would refuse (``lr0: [0, 2]``: --lr0 must be in [0, 1]), before the first iteration,
    instead of failing those iterations with fitness 0. ``config``: the run's settings, with its defaults filled."""
    for name, bounds in space.items():
        for value in (bounds.low, bounds.high):
            try:
                dataclasses.replace(config, **{name: int(value) if is_integer(name) else value}).validate()
            except ValueError as error:
                raise ValueError(f"space: {name}: [{bounds.low:g}, {bounds.high:g}] reaches values train refuses "
                                 f"({error})") from None


def space_to_dict(space: dict[str, Bounds]) -> dict[str, list[float]]:
    """The space as plain lists (YAML's form), for the tune's record of its settings."""
    return {name: [int(v) if is_integer(name) else v for v in bounds[:2]] + [bounds.gain]
            for name, bounds in space.items()}
