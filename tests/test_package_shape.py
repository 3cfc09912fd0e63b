"""The shape of the six packages, checked on the source alone (AST, nothing imported): rooms a reader can
guess (at most MAX_TOP_MODULES modules at the top of ``compiler`` and ``persistent_engine``, the rest in
subpackages), no module-level import circle, no class name defined twice, no function over
MAX_FUNCTION_LINES lines and no file over MAX_FILE_LINES lines (issue 45)."""

from __future__ import annotations

import ast
from collections import Counter
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("traffic_profiles", "cost_model", "persistent_engine", "bulletin_board", "agents", "compiler")
ROOMED = ("compiler", "persistent_engine")       # packages whose top level must stay small
MAX_TOP_MODULES = 12
MAX_FUNCTION_LINES = 80
MAX_FILE_LINES = 600


def sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


@cache
def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_package(path: Path) -> bool:
    return path.name == "__init__.py"


# ------------------------------------------------------------------------------ rooms
@pytest.mark.parametrize("package", ROOMED)
def test_top_level_holds_at_most_twelve_modules(package):
    top = sorted(p.name for p in (ROOT / package).glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, (f"{package}/ has {len(top)} top-level modules (at most {MAX_TOP_MODULES}; "
                                         f"group the rest into subpackages): {', '.join(top)}")


# ------------------------------------------------------------------------------ import circles
def _module_level_imports(node: ast.AST):
    """Import statements that run when the module is imported: not inside a function, not under
    ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            yield from _module_level_imports(ast.Module(body=child.orelse, type_ignores=[]))
        else:
            yield from _module_level_imports(child)


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of the six packages it imports at module level. ``from pkg import name``
    counts ``pkg.name`` when that is a module, else ``pkg``; importing ``a.b.c`` also runs ``a`` and ``a.b``."""
    paths = {module_name(p): p for p in sources()}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        here = name.split(".") if is_package(path) else name.split(".")[:-1]
        deps: set[str] = set()
        for node in _module_level_imports(tree(path)):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    up = here[: len(here) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base for a in node.names]
            for target in targets:
                parts = target.split(".")
                deps |= {".".join(parts[:i]) for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in paths}
        deps.discard(name)
        # a module imports its own packages' __init__ first; that is no edge of its own code
        graph[name] = {d for d in deps if not name.startswith(d + ".")}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle (as a path a -> ... -> a), or None."""
    state: dict[str, int] = {}          # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_no_module_level_import_circle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "module-level import circle: " + " -> ".join(cycle)


def test_the_circle_finder_finds_a_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_imports_inside_functions_and_type_checking_are_not_edges():
    code = ("import os\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x\nelse:\n    import y\n"
            "def f():\n    import z\ntry:\n    import w\nexcept ImportError:\n    pass\n")
    names = [a.name for n in _module_level_imports(ast.parse(code)) for a in n.names]
    assert names == ["os", "TYPE_CHECKING", "y", "w"]


# ------------------------------------------------------------------------------ names and sizes
def test_no_class_name_defined_twice():
    where: dict[str, list[str]] = {}
    for path in sources():
        for node in ast.walk(tree(path)):
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(f"{rel(path)}:{node.lineno}")
    twice = {name: at for name, at in where.items() if len(at) > 1}
    assert not twice, "class names defined more than once:\n" + "\n".join(
        f"{name}: {', '.join(at)}" for name, at in sorted(twice.items()))


def test_no_function_over_eighty_lines():
    long = [f"{rel(path)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path in sources() for node in ast.walk(tree(path))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def test_no_file_over_six_hundred_lines():
    counts = Counter({rel(p): len(p.read_text().splitlines()) for p in sources()})
    big = [f"{name} ({n} lines)" for name, n in counts.most_common() if n > MAX_FILE_LINES]
    assert not big, f"files over {MAX_FILE_LINES} lines:\n" + "\n".join(big)
