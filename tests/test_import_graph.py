"""The import rule of DESIGN.md, checked on the source (every import statement, also those inside
functions): arrows go down the package table only, nothing imports ``compiler``, ``persistent_engine``
imports no sibling and nothing beyond torch, triton, pyzmq and msgpack (and the stdlib), every import
across packages goes through a public face (a package ``__init__`` or ``persistent_engine.models.spec``,
naming only what its ``__all__`` lists), and importing ``persistent_engine.models.spec`` imports no torch."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# DESIGN.md's package table, top to bottom: what each package may import
MAY_IMPORT = {
    "traffic_profiles": set(),
    "cost_model": {"persistent_engine", "traffic_profiles"},
    "persistent_engine": set(),
    "bulletin_board": set(),
    "agents": {"bulletin_board", "persistent_engine", "cost_model", "traffic_profiles"},
    "compiler": {"traffic_profiles", "cost_model", "persistent_engine", "bulletin_board", "agents"},
}
PACKAGES = tuple(MAY_IMPORT)
# cost_model may see the engine's pure-data model spec only (DESIGN.md)
COST_MODEL_ENGINE_FACE = "persistent_engine.models.spec"
# modules that are faces without being a package __init__
MODULE_FACES = {COST_MODEL_ENGINE_FACE}
ENGINE_THIRD_PARTY = {"torch", "triton", "zmq", "msgpack"}


@dataclass(frozen=True)
class Import:
    file: str            # path relative to the repository root
    line: int
    module: str          # the imported module (absolute)
    names: tuple[str, ...]   # ``from module import names``; () for ``import module``

    @property
    def package(self) -> str:
        return self.module.split(".")[0]

    def __str__(self) -> str:
        what = f"from {self.module} import {', '.join(self.names)}" if self.names else f"import {self.module}"
        return f"{self.file}:{self.line}: {what}"


def imports_of(package: str) -> list[Import]:
    """Every absolute import statement in ``package``'s source files."""
    out = []
    for path in sorted((ROOT / package).rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.Import):
                out += [Import(rel, node.lineno, a.name, ()) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                out.append(Import(rel, node.lineno, node.module, tuple(a.name for a in node.names)))
    return out


def across(package: str) -> list[Import]:
    return [i for i in imports_of(package) if i.package in PACKAGES and i.package != package]


def public_names(module: str) -> set[str] | None:
    """``__all__`` of a face; None when ``module`` is no face."""
    path = ROOT.joinpath(*module.split("."))
    if not (path / "__init__.py").exists() and module not in MODULE_FACES:
        return None
    names = getattr(importlib.import_module(module), "__all__", None)
    return None if names is None else set(names)


@pytest.mark.parametrize("package", PACKAGES)
def test_arrows_go_down_the_package_table(package):
    wrong = [str(i) for i in across(package) if i.package not in MAY_IMPORT[package]]
    assert not wrong, f"{package} may import only {sorted(MAY_IMPORT[package])}:\n" + "\n".join(wrong)


def test_cost_model_sees_only_the_engines_model_spec():
    wrong = [str(i) for i in across("cost_model") if i.package == "persistent_engine"
             and i.module != COST_MODEL_ENGINE_FACE]
    assert not wrong, "\n".join(wrong)


def test_persistent_engine_imports_only_torch_triton_pyzmq_msgpack_and_the_stdlib():
    # confine_fs: the sandbox launcher (``python -I -S confine.py``, outside the package) imports its sibling
    allowed = ENGINE_THIRD_PARTY | set(sys.stdlib_module_names) | {"persistent_engine", "__future__", "confine_fs"}
    wrong = [str(i) for i in imports_of("persistent_engine") if i.package not in allowed]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_across_packages_go_through_public_faces(package):
    wrong = []
    for i in across(package):
        names = public_names(i.module)
        if names is None:
            wrong.append(f"{i}  ({i.module} is no public face)")
        elif missing := [n for n in i.names if n not in names]:
            wrong.append(f"{i}  (not in {i.module}.__all__: {', '.join(missing)})")
    assert not wrong, "\n".join(wrong)


def test_faces_export_what_they_list():
    """Every name in a face's ``__all__`` resolves (lazy faces included)."""
    faces = {i.module for p in PACKAGES for i in across(p)} | set(PACKAGES)
    for module in sorted(faces):
        names = public_names(module) or set()
        mod = importlib.import_module(module)
        assert not [n for n in names if not hasattr(mod, n)], module


def test_importing_the_model_spec_imports_no_torch():
    code = ("import sys, persistent_engine.models.spec, cost_model, traffic_profiles, bulletin_board, agents; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
