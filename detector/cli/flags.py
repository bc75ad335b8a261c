"""A command's flags generated from its option dataclass, so the parser and the Python API cannot drift apart."""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import TypeVar

from detector.options import field_type, flag_name, is_required

T = TypeVar("T")


def add_flags(parser: argparse.ArgumentParser, options_class: type, *, negatable: bool = False) -> None:
    """One flag per field, in field order: ``max_det`` -> ``--max-det``, with the field's default, help and choices.

    A flag that is on by default gets a ``--no-`` form; one that is off is a plain switch unless ``negatable``
    (train.py gives every switch both forms, so a script can spell out either).
    """
    for item in fields(options_class):
        kind, _ = field_type(options_class, item.name)
        help_text = item.metadata.get("help", "")
        if kind is bool:
            action = argparse.BooleanOptionalAction if negatable or item.default else "store_true"
            parser.add_argument(flag_name(item.name), dest=item.name, action=action, default=item.default,
                                help=help_text)
        elif is_required(item):
            parser.add_argument(flag_name(item.name), dest=item.name, type=kind, required=True, help=help_text,
                                choices=item.metadata.get("choices"))
        else:
            parser.add_argument(flag_name(item.name), dest=item.name, type=kind, default=item.default, help=help_text,
                                choices=item.metadata.get("choices"))


def options_from_args(options_class: type[T], args: argparse.Namespace) -> T:
    """The option object a parsed command line means (its values checked as it is made)."""
    return options_class(**{item.name: getattr(args, item.name) for item in fields(options_class)})
