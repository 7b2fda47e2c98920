"""The package is built in layers: a module imports only modules of its own layer or below, and no import circle.

The layers are ARCHITECTURE.md's; this test reads every import of `src/longswift` with `ast` (the lazy ones inside
functions too, since a circle of lazy imports is still a circle), so an upward import fails here, not in review.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = SRC / "longswift"

# Lowest first. A name is the first component below `longswift` (a module or a package of modules).
LAYERS: list[tuple[str, ...]] = [
    ("errors", "files", "inputs", "version", "_moved"),  # the foundation: no torch, no configs
    ("config",),  # frozen configuration dataclasses
    ("model",),  # transformer, caches, checkpoints, heads, compiled forwards
    ("decode",),  # AR and TokenSwift decoders and their parts
    ("jobs",),  # job state, batch files, memory plan
    ("parallel",),  # tensor parallelism over torch.distributed
    ("launch",),  # one way to start a job: checkpoint, split check, memory plan, process group
    ("api",),  # longswift.load -> Engine
    ("train",),  # head training
    ("bench", "serve"),  # front ends as libraries
    ("cli",),  # argv and printing
    ("__init__", "__main__"),  # the package's face, `python -m longswift`
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every Python file of the package but the embedded model's data."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if "default_model" in parts:
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that `name` imports, anywhere in the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            targets = [f"{stem}.{alias.name}" if f"{stem}.{alias.name}" in modules else stem for alias in node.names]
        else:
            continue
        out.update(t for t in targets if t in modules and t != name)
    return out


def _layer(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _main_or_init(name: str, path: Path) -> str:
    return "__main__" if path.name == "__main__.py" else _layer(name)


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def test_every_module_has_a_layer():
    unplaced = sorted({_layer(name) for name in _modules()} - set(RANK))
    assert not unplaced, f"add these to LAYERS (and ARCHITECTURE.md): {unplaced}"


def test_imports_point_down():
    modules = _modules()
    up = [
        f"{a} -> {b}"
        for a, targets in _graph().items()
        for b in sorted(targets)
        if RANK[_main_or_init(a, modules[a])] < RANK[_main_or_init(b, modules[b])]
    ]
    assert not up, "imports that point up a layer:\n" + "\n".join(up)


def test_no_import_circle():
    graph = _graph()
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    circles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circles.append(path[path.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


@pytest.mark.parametrize("name", sorted(_modules()))
def test_module_is_small(name):
    lines = len(_modules()[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines; split it by concept (STYLE.md: one concept per module)"


def test_the_check_sees_an_upward_import(tmp_path):
    """The check itself: a model-layer module that imported the CLI lazily would be reported."""
    fake = tmp_path / "fake.py"
    fake.write_text("def f():\n    from ..cli.main import main\n    from . import cache\n")
    assert _imports("longswift.model.fake", fake, _modules()) == {"longswift.cli.main", "longswift.model.cache"}
