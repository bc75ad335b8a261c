"""The house rules of docs/development.md, checked on the source: layers, module size, parameter counts.

Read from the code as text (``ast``), nothing imported, so a lazy import inside a function counts as much as
one at the top of a module: both tie the two packages together.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "detector"

# Lowest first. A package or top-level module may import only from layers below its own, never from its own
# layer or above (inside one package, modules import each other freely). docs/development.md draws this map.
LAYERS: list[set[str]] = [
    {"choices", "defaults", "version", "architecture"},
    {"boxes", "nms", "topk", "files", "device", "precision", "tuning", "options", "paths", "extras", "aliases",
     "forked", "checkpoint_problems", "checkpoint_integrity", "signals"},
    {"distributed", "postprocess", "assigner", "runs"},
    {"model", "loss"},
    {"checkpoint", "data"},
    {"weights", "metrics"},
    {"inference", "plots"},
    {"exporting", "training"},
    {"workflows"},
    {"cli", "api"},
    {"__main__", "__init__"},
]
MAX_MODULE_LINES = 450
MAX_PARAMETERS = 8
# The API's verbs take every flag of their command as a named, typed, defaulted parameter, so that an editor and
# help() show them (tests/test_api.py checks they match the option dataclasses): they mirror the command line,
# whose width is the point, rather than group parameters that belong together. Nothing else is exempt.
WIDE_BY_DESIGN = {"detector.api.train", "detector.api.val", "detector.api.predict", "detector.api.export",
                  # a Triton kernel takes flat pointers, scalars and strides: it cannot take an object
                  "detector.data.warp_kernel.warp_augment"}


def unit(module: str) -> str:
    """``detector.training.engine`` -> ``training``; ``detector`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found.append((name, path))
    return found


def imported_modules(tree: ast.AST, module: str, is_package: bool) -> list[tuple[int, str]]:
    """Every ``detector...`` module this file imports, relative imports resolved, with its line."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.split(".")[0] == "detector"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name.split(".")[0] == "detector":
                found.append((node.lineno, name))
    return found


def layer_of(name: str) -> int:
    for index, layer in enumerate(LAYERS):
        if name in layer:
            return index
    raise KeyError(name)


def test_every_package_has_a_layer() -> None:
    units = {unit(name) for name, _ in modules()}
    missing = sorted(name for name in units if not any(name in layer for layer in LAYERS))
    assert not missing, f"add these to LAYERS (and to docs/development.md's map): {missing}"


def test_imports_point_down_the_layers() -> None:
    wrong = []
    for name, path in modules():
        tree = ast.parse(path.read_text(), filename=str(path))
        for line, imported in imported_modules(tree, name, path.name == "__init__.py"):
            source, target = unit(name), unit(imported)
            if source != target and layer_of(target) >= layer_of(source):
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {imported} ({source} -> {target})")
    assert not wrong, "imports that point up or sideways:\n" + "\n".join(wrong)


@pytest.mark.parametrize("name,path", modules(), ids=[name for name, _ in modules()])
def test_module_is_short(name: str, path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{name}: {lines} lines (> {MAX_MODULE_LINES}): split it by concept"


def test_no_function_takes_more_than_eight_parameters() -> None:
    wide = []
    for name, path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                named = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs if a.arg not in ("self", "cls")]
                count = len(named) + (args.vararg is not None) + (args.kwarg is not None)
                if count > MAX_PARAMETERS and f"{name}.{node.name}" not in WIDE_BY_DESIGN:
                    wide.append(f"{name}.{node.name} (line {node.lineno}): {count} parameters")
    assert not wide, f"group related parameters into an object (> {MAX_PARAMETERS}):\n" + "\n".join(wide)


def test_no_module_imports_itself_through_others() -> None:
    """No import cycle between modules, inside a package either (a cycle makes import order matter)."""
    known = {name for name, _ in modules()}
    graph: dict[str, set[str]] = {}
    for name, path in modules():
        targets = set()
        for _, imported in imported_modules(ast.parse(path.read_text()), name, path.name == "__init__.py"):
            # ``from detector.x import y`` names module x.y when y is a module, else x.
            while imported and imported not in known:
                imported = imported.rpartition(".")[0]
            if imported and imported != name and not name.startswith(imported + "."):
                targets.add(imported)
        graph[name] = targets
    done: set[str] = set()

    def visit(module: str, trail: list[str]) -> None:
        if module in trail:
            raise AssertionError("import cycle: " + " -> ".join(trail[trail.index(module):] + [module]))
        if module in done:
            return
        for target in sorted(graph.get(module, ())):
            visit(target, trail + [module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
