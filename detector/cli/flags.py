"""A command's flags generated from its option dataclass, so the parser and the Python API cannot drift apart."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
import typing
from dataclasses import Field, fields
from typing import Any, TypeVar

from detector.aliases import asks, resume_and_weights, say, translate_with_sources
from detector.architecture import MODEL_NAMES
from detector.choices import canonical_choice
from detector.options import field_type, flag_name, is_required

T = TypeVar("T")


def add_flags(parser: argparse.ArgumentParser, options_class: type, *, negatable: bool = False) -> None:
    """One flag per field, in field order: ``max_det`` -> ``--max-det``, with the field's default, help and choices.

    A flag that is on by default gets a ``--no-`` form; one that is off is a plain switch unless ``negatable``
    (train.py gives every switch both forms, so a script can spell out either).
    """
    for item in fields(options_class):
        kind, _ = field_type(options_class, item.name)
        help_text = with_default(item, item.metadata.get("help", ""), parser)
        if typing.get_origin(kind) is tuple:  # ``--classes 0 2``
            parser.add_argument(flag_name(item.name), dest=item.name, nargs="+", type=typing.get_args(kind)[0],
                                default=item.default, help=help_text, metavar=item.name.upper())
        elif kind is bool:
            action = argparse.BooleanOptionalAction if negatable or item.default else "store_true"
            parser.add_argument(flag_name(item.name), dest=item.name, action=action, default=item.default,
                                help=help_text)
        else:
            choices = item.metadata.get("choices")
            parse = kind if choices is None else choice_parser(kind, choices)
            required = {"required": True} if is_required(item) else {"default": item.default}
            parser.add_argument(flag_name(item.name), dest=item.name, type=parse, help=help_text, choices=choices,
                                **required)


def with_default(item: Field, help_text: str, parser: argparse.ArgumentParser) -> str:
    """``help_text`` naming the field's default, as ``--help`` promises for every option (val's --batch read "images
    per batch", its 32 nowhere), unless the text already says it, the flag is required, the default is None (the
    text says what it stands for) or the parser's formatter adds it (train's)."""
    if ("default" in help_text or is_required(item) or item.default is None
            or issubclass(parser.formatter_class, argparse.ArgumentDefaultsHelpFormatter)):
        return help_text
    return f"{help_text} (default: %(default)s)"


def choice_parser(kind: type, choices: tuple) -> Any:
    """``kind`` for argparse, then the choice a value names in another case (``--optimizer adamw`` -> AdamW)."""
    def parse(text: str) -> Any:
        return canonical_choice(kind(text), choices)
    parse.__name__ = kind.__name__  # argparse names the type in its "invalid value" line
    return parse


def options_from_args(options_class: type[T], args: argparse.Namespace) -> T:
    """The option object a parsed command line means (its values checked as it is made)."""
    return options_class(**{item.name: getattr(args, item.name) for item in fields(options_class)})


# ``epochs=3``: Ultralytics' command-line form. The key is a Python name; a token that is the value of a flag
# before it (``--name run=1``) is left alone.
KEY_VALUE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.DOTALL)
BARE_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # a switch's name alone turns it on, as Ultralytics reads it


def parse_value(text: str) -> Any:
    """``key=value`` text as Ultralytics reads it: True/False, None, numbers, ``[0, 2]`` lists; else the text."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    if text.startswith("[") and text.endswith("]"):
        return [parse_value(part.strip()) for part in text[1:-1].split(",") if part.strip()]
    return text


def split_key_values(parser: argparse.ArgumentParser,
                     argv: list[str]) -> tuple[list[str], dict[str, str], dict[str, int]]:
    """-> (the ``--flag`` tokens, ``{key: text}`` of the ``key=value`` ones, ``{key: slot}``): a key's slot is
    the number of flag tokens before its last ``key=value``, where its flags go so that order decides."""
    rest: list[str] = []
    pairs: dict[str, str] = {}
    slots: dict[str, int] = {}
    for index, token in enumerate(argv):
        # argparse keeps no public map from option string to action; this one has been stable since Python 3.2.
        previous = parser._option_string_actions.get(argv[index - 1]) if index else None
        is_value_of_flag = previous is not None and previous.nargs != 0
        match = KEY_VALUE.fullmatch(token)
        if match and not is_value_of_flag:
            pairs[match.group(1)], slots[match.group(1)] = match.group(2), len(rest)
        elif BARE_KEY.fullmatch(token) and not is_value_of_flag and is_switch(parser, token):
            pairs[token], slots[token] = "True", len(rest)  # Ultralytics' ``yolo train resume``, ``yolo predict save``
        else:
            rest.append(token)
    return rest, pairs, slots


def is_switch(parser: argparse.ArgumentParser, word: str) -> bool:
    """Whether ``word`` names a flag that takes no value or an optional one (``save``, ``resume``): only those read
    as ``word=True`` alone (``epochs 3`` stays a mistake argparse names, not ``epochs=True``)."""
    action = parser._option_string_actions.get("--" + word.replace("_", "-"))
    return action is not None and action.nargs in (0, "?")


def flag_tokens(parser: argparse.ArgumentParser, options_class: type, values: dict[str, Any],
                texts: dict[str, str]) -> list[str]:
    """Our field values -> the ``--flag`` tokens that mean them, so argparse checks them as it checks flags.

    ``texts``: the user's own text for a value that was not converted (passed as typed, so ``name=1e3`` stays
    ``1e3``). Unknown names are a usage error, with the nearest flag names.
    """
    known = {item.name: item for item in fields(options_class)}
    tokens: list[str] = []
    for name, value in values.items():
        if name not in known:
            near = [k for k in known if name.startswith(k) or k.startswith(name)]
            near = near or difflib.get_close_matches(name, known, n=3)
            hint = f"; did you mean {', '.join(near)}?" if near else ""  # the parser's error adds where help is
            parser.error(f"unknown argument {name}={texts.get(name, value)}{hint}")
        if value is None:
            continue
        kind, _ = field_type(options_class, name)
        flag = flag_name(name)
        if kind is bool:
            if not isinstance(value, bool):
                parser.error(f"{name}={texts.get(name, value)}: expected True or False")
            negative = "--no-" + flag[2:]
            if value:
                tokens.append(flag)
            elif negative in parser._option_string_actions:
                tokens.append(negative)
            elif known[name].default is not False:
                parser.error(f"{name}=False: {flag} has no off form")
        elif typing.get_origin(kind) is tuple:
            items = value.split(",") if isinstance(value, str) else value if isinstance(value, (list, tuple)) \
                else [value]
            tokens += [flag, *(str(item).strip() for item in items)]
        else:
            tokens += [flag, texts[name] if name in texts else ",".join(map(str, value))
                       if isinstance(value, (list, tuple)) else str(value)]
    return tokens


def parse_command(parser: argparse.ArgumentParser, options_class: type, command: str,
                  argv: list[str] | None) -> argparse.Namespace:
    """Parse ``--flag value`` and Ultralytics' ``key=value`` arguments (our names or its aliases,
    :mod:`detector.aliases`) alike; each alias says once what our name is. The later of two arguments that set
    one field wins, whichever form each has (as a repeated flag does in argparse).

    Train's ``--model yolov8n.pt`` is the ``model`` alias too: a weights file with its scale.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if command == "train":
        argv = model_flag_as_alias(argv)
    rest, pairs, slots = split_key_values(parser, argv)
    given = {name: parse_value(text) for name, text in pairs.items()}
    settings_file = given.pop("cfg", None)  # Ultralytics' cfg=args.yaml: read below, under the command line's own
    notes: list[str] = []  # said once the whole line is settled: no note about an argument an error then refuses
    try:
        values, came_from = translate_with_sources(command, given, note=notes.append)
    except (TypeError, ValueError) as error:
        # translate names the command for the Python API's sake; here the parser's prog names it already.
        parser.error(str(error).removeprefix(f"{command}: "))
    unchanged = {name: pairs[name] for name in pairs if name in values and values[name] is given[name]}
    # Each key=value's flags go where it was: appended after every flag, it beat a later --flag silently.
    at_slot: dict[int, dict[str, Any]] = {}
    for name, value in values.items():
        at_slot.setdefault(slots.get(came_from[name], len(rest)), {})[name] = value
    ordered: list[str] = []
    for slot in range(len(rest) + 1):
        ordered += flag_tokens(parser, options_class, at_slot.get(slot, {}), unchanged)
        ordered += rest[slot:slot + 1]
    if settings_file is not None:
        ordered = settings_tokens(parser, options_class, command, str(settings_file), set(values) | dests(parser, rest),
                                  notes) + ordered
    args = parser.parse_args(ordered)
    mark_overridden(parser, notes, rest, {name: slots[source] for name, source in came_from.items() if source in slots},
                    came_from)
    if command == "train":
        settle_resume(parser, args, given)
    for line in notes:
        say(line)
    return args


def mark_overridden(parser: argparse.ArgumentParser, notes: list[str], rest: list[str], at: dict[str, int],
                    came_from: dict[str, str]) -> None:
    """Each alias's note in ``notes`` that a later ``--flag`` overrode ends saying so (``amp=False --precision bf16``
    trains BF16: its note "amp=False is precision='fp32'" alone would contradict the run). ``at``: each field's
    slot, the number of ``rest`` tokens before the ``key=value`` that set it."""
    later: dict[str, dict[str, str]] = {}  # alias -> {field: the later flag's text}
    for field, name in came_from.items():
        flag = last_flag_for(parser, rest[at[field]:], field) if field in at else None
        if flag is not None:
            later.setdefault(name, {})[field] = flag
    for name, flags in later.items():
        prefix = f"note: Ultralytics' {name}="
        fields = [field for field, source in came_from.items() if source == name]
        if len(flags) == len(fields):
            suffix = f"; overridden by the later {' '.join(dict.fromkeys(flags.values()))}"
        else:
            suffix = "; " + ", ".join(f"{field} overridden by the later {flag}" for field, flag in flags.items())
        notes[:] = [line + suffix if line.startswith(prefix) else line for line in notes]


def last_flag_for(parser: argparse.ArgumentParser, tokens: list[str], field: str) -> str | None:
    """The last ``--flag [value]`` in ``tokens`` that sets ``field``, as typed; None when none does."""
    found = None
    for index, token in enumerate(tokens):
        action = flag_action(parser, token)
        if action is None or action.dest != field:
            continue
        takes_value = action.nargs != 0 and "=" not in token and index + 1 < len(tokens)
        found = f"{token} {tokens[index + 1]}" if takes_value else token
    return found


def settings_tokens(parser: argparse.ArgumentParser, options_class: type, command: str, path: str, given: set[str],
                    notes: list[str]) -> list[str]:
    """The ``--flag`` tokens of ``cfg=path``'s settings (detector/cli/settings_file.py), to go before the command
    line's own so that those win; its note first in ``notes``."""
    from detector.cli.settings_file import read_settings

    try:
        values, line = read_settings(path, command, options_class, given)
    except ValueError as error:
        parser.error(str(error))
    notes.insert(0, line)
    return flag_tokens(parser, options_class, values, {})


def dests(parser: argparse.ArgumentParser, tokens: list[str]) -> set[str]:
    """The fields ``--flag`` tokens set (``--no-plots`` -> plots)."""
    actions = (flag_action(parser, token) for token in tokens)
    return {action.dest for action in actions if action is not None}


def flag_action(parser: argparse.ArgumentParser, token: str) -> argparse.Action | None:
    """The parser's action for a ``--flag`` or ``--flag=value`` token; None for a value or an unknown flag."""
    return parser._option_string_actions.get(token.split("=", 1)[0]) if token.startswith("-") else None


def settle_resume(parser: argparse.ArgumentParser, args: argparse.Namespace, given: dict[str, Any]) -> None:
    """Train's ``--resume``/``--weights`` read together, as :func:`translate_with_sources` reads them when all are
    ``key=value``: ``resume=True --weights last.pt`` resumes last.pt; a resume file beside a different weights
    file, or ``pretrained=False`` beside one, is a usage error."""
    try:
        args.resume, args.weights = resume_and_weights(
            args.resume, args.weights, resume_true=args.resume == "auto" and asks(given.get("resume"), True),
            pretrained_false=asks(given.get("pretrained"), False), note=say)
    except TypeError as error:
        parser.error(str(error))


def model_flag_as_alias(argv: list[str]) -> list[str]:
    """``--model yolov8n.pt`` (anything but a model name: ``n`` ... ``x``, ``11n`` ... ``11x``) -> ``model=yolov8n.pt``,
    for :func:`parse_command`."""
    out: list[str] = []
    index = 0
    while index < len(argv):
        token = argv[index]
        value = None
        if token == "--model" and index + 1 < len(argv):
            value, index = argv[index + 1], index + 1
        elif token.startswith("--model="):
            value = token.split("=", 1)[1]
        if value is None:
            out.append(token)
        elif value in MODEL_NAMES:
            out += ["--model", value]
        else:
            out.append(f"model={value}")
        index += 1
    return out
