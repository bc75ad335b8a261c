"""Ultralytics' ``cfg=FILE.yaml``: a command's settings read from a YAML file, such as the ``args.yaml`` an
Ultralytics run leaves in its folder, so that a run made there can be made here with one argument.

The file's keys are read as the same ``key=value`` arguments would be (:mod:`detector.aliases`), under the command
line's own: a setting the command line gives wins. An ``args.yaml`` holds every setting of every mode (``source``,
``format``, ``conf`` beside ``epochs``), and Ultralytics-only ones (``save_dir``): what the command does not take,
or has no equivalent for, is left out and named in one note, where the same key typed on the command line would
be refused. A value that cannot be converted (``optimizer: Lion``) is refused as on the command line.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

from detector.aliases import translate_with_sources


def read_settings(path_text: str, command: str, options_class: type,
                  given: set[str]) -> tuple[dict[str, Any], str]:
    """-> (our field values the file sets, one note saying what was taken and what was left).

    ``given``: our field names the command line sets itself; the file's values for them are left out (and both
    ``model`` and ``weights`` where it sets either: the file's scale must not come with another weights file).

    Raises:
        ValueError: the file is missing, is not YAML, is not a mapping, or has a value that cannot be converted;
            one line naming it.
    """
    import yaml

    path = Path(path_text).expanduser()
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ValueError(f"cfg={path_text}: cannot read it ({error.strerror or error})") from None
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise ValueError(f"cfg={path_text}: not a YAML file ({str(error).splitlines()[0]})") from None
    if not isinstance(loaded, dict):
        raise ValueError(f"cfg={path_text}: expected 'key: value' settings, found {type(loaded).__name__}")
    known = {item.name for item in fields(options_class)}
    if given & {"model", "weights"}:
        given = given | {"model", "weights"}
    taken: dict[str, Any] = {}
    no_equivalent: list[str] = []
    not_ours: list[str] = []
    for name, value in loaded.items():
        name = str(name)
        if name == "cfg" or value is None:  # None: Ultralytics' "unset", our default stands
            continue
        try:  # a name with no equivalent at a value that asks for nothing maps to nothing; at another, TypeError
            mapped, _ = translate_with_sources(command, {name: value}, note=lambda line: None)
        except TypeError:
            no_equivalent.append(f"{name}={value!r}")
            continue
        except ValueError as error:
            raise ValueError(f"cfg={path_text}: {str(error).removeprefix(f'{command}: ')}") from None
        if not set(mapped) <= known:
            not_ours.append(name)
            continue
        taken.update({ours: converted for ours, converted in mapped.items() if ours not in given})
    return taken, settings_note(path_text, command, taken, no_equivalent, not_ours)


def settings_note(path_text: str, command: str, taken: dict[str, Any], no_equivalent: list[str],
                  not_ours: list[str]) -> str:
    """One line: how many settings came from the file, and which were left and why."""
    parts = [f"note: cfg={path_text}: {len(taken)} settings taken (the command line's own win)"]
    if no_equivalent:
        parts.append(f"left, with no equivalent here: {', '.join(no_equivalent)}")
    if not_ours:
        shown = ", ".join(not_ours[:8]) + (f" and {len(not_ours) - 8} more" if len(not_ours) > 8 else "")
        parts.append(f"left, not {command}'s settings: {shown}")
    return "; ".join(parts)
