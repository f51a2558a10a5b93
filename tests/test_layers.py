"""The tree is the architecture: imports point one way, and no module imports itself in a circle.

:data:`LAYERS` is the order, written once (docs/concepts/architecture.md shows it and a test
below checks that it does). A module may import its own layer and those below it, never one
above; every import counts, those inside functions too (a lazy import is still an arrow), but
not those under ``if TYPE_CHECKING:`` (annotations only). The Python API and the commands share a
layer: ``kvplan simulate`` and ``kvplan size`` are built on :mod:`simulator.api`, and
:func:`simulator.api.search` runs the search ``kvplan capacity`` runs; the circle test keeps
them from importing each other both ways. The commands are reached from the CLI
through a registry of module names (:data:`simulator.cli.COMMANDS`) and ``"module:function"``
strings, which import nothing until a command runs.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("simulator", "workloads", "backend")

# Lowest first. Each entry: a module or package prefix; the longest prefix that matches decides.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("simulator.errors", "simulator.yamlfile", "simulator.compiled", "simulator"),  # the base
    ("workloads",),                                       # requests, traces, clients
    ("simulator.kv",),                                    # sizing, catalogs, allocators
    ("simulator.scheduler", "simulator.latency"),         # policies -> StepPlan; step times
    ("simulator.config",),                                # scenario -> deployment
    ("simulator.engine",),                                # SimPy engine, runs, metrics
    ("simulator.report",),                                # folders, files, tables, plots, HTML
    ("simulator.api", "simulator.commands"),              # the two faces: Python API, commands
    ("simulator.cli", "backend"),                         # parse and dispatch; the real engine
)


def layer_of(module: str) -> int:
    best, found = -1, None
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, found = len(p), i
    assert found is not None, f"{module} is in no layer of tests/test_layers.py"
    return found


def module_files() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


MODULES = module_files()


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def resolve(name: str) -> str | None:
    """The project module an imported name is (its longest known prefix), or None."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in MODULES:
            return candidate
        parts.pop()
    return None


def imports_of(module: str) -> set[str]:
    """The project modules ``module`` imports (``from a import b`` counts a.b if it is a module)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_lines(tree)
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, *([base] if base else [])])
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for name in names:
            target = resolve(name)
            if target is not None and target != module:
                found.add(target)
    return found


GRAPH = {m: imports_of(m) for m in MODULES}


def test_every_module_is_in_a_layer() -> None:
    for module in MODULES:
        layer_of(module)


def test_no_import_points_upward() -> None:
    upward = [f"{m} (layer {layer_of(m)}) imports {t} (layer {layer_of(t)})"
              for m, targets in sorted(GRAPH.items()) for t in sorted(targets)
              if layer_of(t) > layer_of(m) and not _package_init(m, t)]
    assert not upward, "imports that point upward:\n" + "\n".join(upward)


def _package_init(module: str, target: str) -> bool:
    """``simulator/__init__.py`` is the base layer's file but the root of every package: it may
    import only the base (checked apart), and a package ``__init__`` importing its own children
    is not an arrow between layers."""
    return target.startswith(module + ".") and module != "simulator"


def test_no_import_circle() -> None:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components, iteratively deep enough here
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(GRAPH[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(GRAPH):
        if module not in index:
            visit(module)
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_the_simulator_never_imports_the_backend() -> None:
    """The real engine (torch, triton) arrives through entry points (pyproject.toml)."""
    bad = [f"{m} imports {t}" for m, targets in GRAPH.items() if not m.startswith("backend")
           for t in targets if t.startswith("backend")]
    assert not bad


def test_the_architecture_page_shows_this_order() -> None:
    page = (ROOT / "docs" / "concepts" / "architecture.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- layers -->\n```text\n(.*?)```", page, re.S)
    assert block, "docs/concepts/architecture.md has no <!-- layers --> block"
    shown = [line.split("#")[0].split() for line in block.group(1).strip().splitlines()]
    assert [tuple(words) for words in reversed(shown)] == [tuple(p) for p in LAYERS], (
        "docs/concepts/architecture.md's layer block differs from tests/test_layers.py LAYERS "
        "(top layer first there)")


@pytest.mark.parametrize("module", ["simulator"])
def test_the_root_package_imports_only_the_base(module: str) -> None:
    assert all(layer_of(t) == 0 for t in GRAPH[module]), GRAPH[module]
