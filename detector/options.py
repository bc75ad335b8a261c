"""Option objects: one dataclass per command (``TrainConfig``, ``ValOptions``, ...), its fields the command's flags.

A field is a flag (``max_det`` -> ``--max-det``) with its default and a ``metadata={"help": ...}`` (plus
``"choices"`` where the values are a fixed set); detector/cli generates each parser from these fields, so the
command line and the Python API (``detector.api``) take the same names and cannot drift apart. Values are
checked here, not by argparse alone, so a caller from Python hears about a bad value too: one-line
``ValueError`` naming the flag.
"""

from __future__ import annotations

import os
import typing
from dataclasses import MISSING, Field, field, fields
from pathlib import Path
from types import NoneType, UnionType
from typing import Any, TypeVar

from detector.choices import canonical_choice

T = TypeVar("T")
REQUIRED: Any = MISSING  # a field with no default is a required flag


def option(default: Any = REQUIRED, help: str = "", **extra: Any) -> Any:  # noqa: A002 - argparse's name
    """A flag: its default (``REQUIRED``: none) and help, plus ``choices=(...)`` where the values are fixed."""
    return field(default=default, metadata={"help": help, **extra})


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def field_type(options_class: type, name: str) -> tuple[type, bool]:
    """-> (the field's type, whether it may be None): ``Path | None`` -> ``(Path, True)``."""
    hint = typing.get_type_hints(options_class)[name]
    if isinstance(hint, UnionType) or typing.get_origin(hint) is typing.Union:
        members = [member for member in typing.get_args(hint) if member is not NoneType]
        return members[0], len(members) < len(typing.get_args(hint))
    return hint, False


def is_required(item: Field) -> bool:
    return item.default is MISSING and item.default_factory is MISSING


def coerce(options_class: type, item: Field, value: Any) -> Any:
    """``value`` as the field's type, as argparse would have made it from text; ``ValueError`` naming the flag.

    Strings are accepted where argparse would parse them (``"320"`` for an int); a path is accepted for a text
    field (``project=Path(...)``: a checkpoint stores the config, and only plain types are read back from one);
    a list for a text field is joined by commas (``format=["onnx", "engine"]``).
    """
    kind, optional = field_type(options_class, item.name)
    flag = flag_name(item.name)
    if value is None and optional:
        return None
    if typing.get_origin(kind) is tuple:  # ``--classes 0 2``: a tuple of one element type
        return tuple_of(typing.get_args(kind)[0], value, flag)
    try:
        if kind is bool and not isinstance(value, bool):
            raise TypeError
        if kind in (int, float) and isinstance(value, bool):
            raise TypeError  # True is an int to Python, never a size or a threshold to a user
        if kind is int:
            if isinstance(value, float) and not value.is_integer():
                raise TypeError
            value = int(value)
        elif kind is float:
            value = float(value)
        elif kind is Path:
            value = Path(value)
        elif kind is str:
            if isinstance(value, (list, tuple)):
                value = ",".join(map(str, value))
            elif isinstance(value, os.PathLike):
                value = os.fspath(value)
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                value = str(value)
            elif not isinstance(value, str):
                raise TypeError
    except (TypeError, ValueError):
        raise ValueError(f"{flag}: expected {kind.__name__}{' or None' if optional else ''}, got {value!r}") from None
    choices = item.metadata.get("choices")
    value = canonical_choice(value, choices)
    if choices is not None and value not in choices:
        raise ValueError(f"{flag}: invalid choice: {value!r} (choose from {', '.join(map(repr, choices))})")
    return value


def tuple_of(element: type, value: Any, flag: str) -> tuple:
    """``0``, ``[0, 2]`` or ``"0,2"`` -> ``(0, 2)`` for a ``tuple[int, ...]`` field; ``ValueError`` naming the flag."""
    items = value.split(",") if isinstance(value, str) else value if isinstance(value, (list, tuple)) else [value]
    try:
        if any(isinstance(item, bool) for item in items):
            raise TypeError
        return tuple(element(item) for item in items)
    except (TypeError, ValueError):
        raise ValueError(f"{flag}: expected {element.__name__} values, got {value!r}") from None


def check_options(options: Any) -> None:
    """Coerce and check every field of a dataclass instance in place (``ValueError`` on the first bad one)."""
    for item in fields(options):
        setattr(options, item.name, coerce(type(options), item, getattr(options, item.name)))


class Options:
    """Base of the workflows' option dataclasses: values are checked as the object is made."""

    def __post_init__(self) -> None:
        check_options(self)


def build_options(options_class: type[T], values: dict[str, Any], *, command: str) -> T:
    """``options_class(**values)`` for the Python API, with one-line errors that name the argument.

    ``None`` leaves a flag at its default. An unknown or missing name raises ``TypeError`` (listing the known
    ones), a bad value ``ValueError``. Works for any dataclass of flags (``TrainConfig`` too), checked here
    whether or not the class checks itself.
    """
    known = {item.name: item for item in fields(options_class)}
    for name in values:
        if name not in known:
            raise TypeError(f"{command}: unknown argument {name!r}; known: {', '.join(sorted(known))}")
    given = {name: value for name, value in values.items() if value is not None}
    for name, item in known.items():
        if is_required(item) and name not in given:
            raise TypeError(f"{command}: missing argument {name!r} ({flag_name(name)})")
    options = options_class(**given)
    check_options(options)
    return options
