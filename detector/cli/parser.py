"""The parser every command builds: a usage error is one line (the problem, a suggestion, where help is), exit 2.

argparse prints the whole usage before its one useful line; train's is ~40 lines, so the line that says what was
wrong scrolled away. ``--help`` still prints the usage in full.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Sequence
from typing import Any, NoReturn

from detector.aliases import TABLES, translate
from detector.cli.flags import parse_value


class CommandParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are ``PROG: error: MESSAGE (see PROG --help)`` on one line.

    ``command``: the table of :mod:`detector.aliases` to consult when a flag is not ours, so ``--save_period 5``
    gets the answer ``save_period=5`` gets ("" for a command without Ultralytics names).
    """

    def __init__(self, *args: Any, command: str = "", **kwargs: Any) -> None:
        # No abbreviations: argparse took --epoch for --epochs silently, and --amp False for --amp-check (then
        # complained about 'False'); a flag not spelled out gets the nearest one suggested instead.
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.command = command

    def error(self, message: str) -> NoReturn:
        # Exit 2, as argparse's own error does: detector/cli/__init__.py documents it as the usage error's code.
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        """As argparse's, with a suggestion for the first unrecognized flag (:func:`flag_hint`)."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            hint = first_hint(self, extras)
            self.error(f"unrecognized arguments: {' '.join(extras)}{'; ' + hint if hint else ''}")
        return parsed


def first_hint(parser: CommandParser, extras: list[str]) -> str:
    """The suggestion for the first of the unrecognized ``extras`` that is a flag and has one, else ""."""
    for index, token in enumerate(extras):
        if token.startswith("-") and (hint := flag_hint(parser, token, following(extras, index))):
            return hint
    return ""


def following(tokens: list[str], index: int) -> str | None:
    """The value given with the flag at ``index`` (``--x=1`` or ``--x 1``), or None."""
    if "=" in tokens[index]:
        return tokens[index].split("=", 1)[1]
    if index + 1 < len(tokens) and not tokens[index + 1].startswith("-"):
        return tokens[index + 1]
    return None


def flag_hint(parser: CommandParser, token: str, value: str | None) -> str:
    """What the user may have meant by the unknown flag ``token``: Ultralytics' note on the name, our flag spelled
    with ``-`` for ``_`` (``--max_det``), or the nearest flag; "" when nothing is near."""
    written = token.split("=", 1)[0]
    name = written.lstrip("-").replace("-", "_")
    if parser.command and name in TABLES[parser.command]:
        return alias_hint(parser.command, name, value)
    # argparse's map from option string to action: private, and relied on already in detector/cli/flags.py.
    flags = {option[2:]: option for option in parser._option_string_actions if option.startswith("--")}
    dashed = name.replace("_", "-")
    # Compared without the dashes every flag shares, which made --bogus "near" --iou. At 0.7 --epoch finds
    # --epochs and --batchsize --batch, and a word unlike every flag finds none.
    near = [dashed] if dashed in flags else difflib.get_close_matches(dashed, flags, n=1, cutoff=0.7)
    return f"did you mean {flags[near[0]]}?" if near else ""


def alias_hint(command: str, name: str, value: str | None) -> str:
    """Ultralytics' ``name`` given as a flag: what :func:`detector.aliases.translate` says of ``name=value``.

    Its refusal (no equivalent here) or its note, and the flags that are ours for it.
    """
    alias = TABLES[command][name]
    if value is None and alias.means is None:  # ``--save-period`` alone: no value to quote
        return f"Ultralytics' {name} has no equivalent here: {alias.says}"
    notes: list[str] = []
    given = parse_value(value) if value is not None else True  # a bare ``--cos-lr``: a switch turned on
    try:
        ours = translate(command, {name: given}, note=notes.append)
    except (TypeError, ValueError) as error:
        return str(error).removeprefix(f"{command}: ")
    said = notes[0].removeprefix("note: ") if notes else ""
    if not ours:  # accepted with no effect (Ultralytics' default): the note says what we do instead
        return said
    flags = " ".join("--" + field.replace("_", "-") for field in ours)
    if value is None:  # the note would quote a value the user did not give
        said = f"Ultralytics' {name} is {', '.join(ours)} here" if set(ours) != {name} else ""
    return f"did you mean {flags}? ({said})" if said else f"did you mean {flags}?"

