"""The README, weights/README.md and docs/ stay true: every command they show parses, every entry point answers
--help, every link resolves.

Each fenced command line that starts with ``python train.py``, ``python export.py``, ``python -m detector``,
``detector`` or ``torchrun ... train.py`` is parsed by that entry point's own argparse parser, so a renamed or
removed flag, or an unknown command, fails here instead of in a reader's terminal. Nothing is trained: parsing
is all. Placeholders (``<!-- ... -->``, filled in later) are HTML comments outside fences and are ignored.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from detector.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", ROOT / "weights" / "README.md", *DOCS]
FENCE = re.compile(r"^```(\w*)\s*$")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
OURS = re.compile(r"^(\w+=\S+\s+)*(python (train|export)\.py|python -m detector\b|detector(\s|$)|torchrun\s)")
HELP_TIMEOUT_S = 120  # one cold import of torch on a loaded 2-core machine is ~10 s; generous, never hit when healthy


@dataclass(frozen=True)
class Command:
    page: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.text}"


def fenced_lines(page: Path) -> list[tuple[int, str]]:
    """(line number, logical line) of every line inside a fenced block, ``\\`` continuations joined."""
    out: list[tuple[int, str]] = []
    inside, pending, start = False, "", 0
    for number, raw in enumerate(page.read_text().splitlines(), 1):
        if FENCE.match(raw.strip()):
            inside, pending = not inside, ""
            continue
        if not inside:
            continue
        line = raw.strip()
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append((start, pending + line))
        pending = ""
    return out


def entry_argv(text: str) -> tuple[str, list[str]] | None:
    """("train" | "export" | a ``python -m detector`` command, its arguments), or None when not one of ours."""
    if not OURS.match(text):
        return None
    words = shlex.split(text, comments=True)
    while words and re.match(r"^\w+=", words[0]):  # OMP_NUM_THREADS=1 python train.py ...
        words = words[1:]
    if words[0] == "torchrun":
        if "train.py" not in words:
            return None
        return "train", words[words.index("train.py") + 1 :]
    if words[:2] in (["python", "train.py"], ["python", "export.py"]):
        return words[1].removesuffix(".py"), words[2:]
    if words[:3] == ["python", "-m", "detector"]:
        words = words[2:]
    if words[0] == "detector":
        if len(words) == 1 or words[1] in ("-h", "--help"):
            return "", words[1:]
        return words[1], words[2:]
    return None


def documented_commands() -> list[Command]:
    commands = []
    for page in PAGES:
        for number, text in fenced_lines(page):
            if entry_argv(text) is not None:
                commands.append(Command(str(page.relative_to(ROOT)), number, text))
    return commands


def parser_for(command: str) -> argparse.ArgumentParser:
    module = importlib.import_module(COMMANDS[command][0])
    return module.build_parser()


def test_the_pages_show_commands() -> None:
    """The extraction itself works: the README's set-up-and-go and usage lines are found."""
    found = {entry_argv(c.text)[0] for c in documented_commands()}
    assert {"train", "val", "predict", "export", "download"} <= found, found


def refusal(text: str) -> str | None:
    """None when the entry point's own parser accepts the command line, else why not (argparse's message)."""
    name, argv = entry_argv(text)
    if name == "" or "-h" in argv or "--help" in argv:
        return None  # the command list, or --help (which exits): the subprocess test below runs those for real
    if name not in COMMANDS:
        return f"no such command {name!r} (known: {', '.join(COMMANDS)})"
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            if name == "ablate-amp":  # its unknown flags go to each training run: parse them as train's
                _, rest = parser_for(name).parse_known_args(argv)
                parser_for("train").parse_args(rest)
            else:  # a command's own parse_args takes key=value arguments too (detector/cli/flags.py)
                module = importlib.import_module(COMMANDS[name][0])
                getattr(module, "parse_args", parser_for(name).parse_args)(argv)
    except SystemExit as error:
        return f"argparse refused it (exit {error.code}): {stderr.getvalue().strip()}"
    return None


@pytest.mark.parametrize("command", documented_commands(), ids=str)
def test_documented_command_parses(command: Command) -> None:
    why = refusal(command.text)
    assert why is None, f"{command}\n{why}"


def test_a_wrong_command_is_refused() -> None:
    """The check can fail: a flag no parser has, a bad choice, an unknown command, ablate-amp's pass-through."""
    assert refusal("python train.py --data my.yaml --no-such-flag 1") is not None
    assert refusal("python -m detector val --weights best.pt --data my.yaml --split nope") is not None
    assert refusal("detector frobnicate --weights best.pt") is not None
    assert refusal("python -m detector ablate-amp --epochs 2 --no-such-flag") is not None
    assert refusal("OMP_NUM_THREADS=1 python train.py --data my.yaml --epochs 3") is None
    assert refusal("detector train data=my.yaml epochs=3 amp=False") is None  # key=value, Ultralytics' names too
    assert refusal("detector train data=my.yaml copy_paste=0.3") is not None  # no equivalent: refused
    assert refusal("detector predict source=0 conf=high") is not None


# The scripts as a user starts them, in their own processes (each imports torch: ~6 s on 2 cores); every command's
# parser is also asked in this process below, where the imports are already paid.
SCRIPTS = [["train.py"], ["export.py"], ["-m", "detector"], ["-m", "detector", "val"]]


@pytest.mark.parametrize("entry", SCRIPTS, ids=" ".join)
def test_entry_point_answers_help(entry: list[str]) -> None:
    result = subprocess.run([sys.executable, *entry, "--help"], cwd=ROOT, capture_output=True, text=True,
                            timeout=HELP_TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_answers_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    from detector.cli import main

    with pytest.raises(SystemExit) as exit_:
        main([name, "--help"])
    assert exit_.value.code == 0
    assert "usage:" in capsys.readouterr().out


def relative_links(page: Path) -> list[tuple[str, Path, str]]:
    """(target as written, file it names, #anchor or "") of every link that is not a URL."""
    links = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"^[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        links.append((target, (page.parent / file).resolve() if file else page.resolve(), anchor))
    return links


def heading_anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    anchors = set()
    inside = False
    for line in page.read_text().splitlines():
        if FENCE.match(line.strip()):
            inside = not inside
        elif not inside and (match := re.match(r"^#+\s+(.*)$", line)):
            anchors.add(re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-"))
    return anchors


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    missing = [target for target, path, _ in relative_links(page) if not path.exists()]
    assert not missing, f"{page.relative_to(ROOT)}: links to missing files: {missing}"
    broken = [target for target, path, anchor in relative_links(page)
              if anchor and path.suffix == ".md" and path.exists() and anchor not in heading_anchors(path)]
    assert not broken, f"{page.relative_to(ROOT)}: links to headings that do not exist: {broken}"


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {path for _, path, _ in relative_links(ROOT / "README.md")}
    orphans = [page.name for page in DOCS if page.resolve() not in linked]
    assert not orphans, f"docs pages the README does not link: {orphans}"
