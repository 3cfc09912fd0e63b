"""Composing accepted candidates into ONE candidate source file (DESIGN.md "Candidate").

The engine loads one file per candidate, so the accepted overrides are merged textually (an AST
rewrite, no ``exec``): each part's top-level statements are kept in order; identical top-level
imports are kept once (``from __future__`` ones hoisted first); a top-level name that an earlier part
already defines is renamed ``_c<i>_<name>`` in the later part, scope-aware (a function's own local
or parameter of that name is left alone), so helpers and kernels of different candidates cannot
capture each other. ``OVERRIDES`` become one dict literal (dict-literal entries are folded in;
others are spread), ``CONFIG`` dicts merge the same way; :func:`select_compatible` first keeps
each op and knob with one owner. :func:`with_pdl` turns programmatic dependent launch on in every template
kernel of a composed source at once (the plan-wide PDL knob the composition tries).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from persistent_engine import CONTRACT_NAMES, CandidateSource

SPECIAL = CONTRACT_NAMES


class ComposeError(ValueError):
    """A part that cannot be composed (it does not parse)."""


@dataclass(frozen=True)
class Part:
    name: str
    source: str
    targets: tuple[str, ...] = ()          # op names it overrides
    config_keys: tuple[str, ...] = ()      # CONFIG knobs it sets


def _bound_names(stmt: ast.stmt) -> list[str]:
    """Names a top-level statement binds in the module namespace."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in stmt.names if a.name != "*"]
    targets: list[ast.expr] = []
    if isinstance(stmt, ast.Assign):
        targets = stmt.targets
    elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
        targets = [stmt.target]
    elif isinstance(stmt, (ast.For, ast.AsyncFor)):
        targets = [stmt.target]
    elif isinstance(stmt, (ast.With, ast.AsyncWith)):
        targets = [i.optional_vars for i in stmt.items if i.optional_vars is not None]
    elif isinstance(stmt, (ast.If, ast.Try)):
        out = []
        for sub in ast.iter_child_nodes(stmt):
            if isinstance(sub, ast.stmt):
                out += _bound_names(sub)
            elif isinstance(sub, ast.ExceptHandler):
                for s in sub.body:
                    out += _bound_names(s)
        return out
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


def _function_locals(fn: ast.AST) -> set[str]:
    """Parameters and names assigned inside a function body (not nested functions), minus globals."""
    args = fn.args
    names = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
    names |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
    declared_global: set[str] = set()
    stack = list(fn.body) if isinstance(fn.body, list) else [fn.body]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue                                   # its body is its own scope
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            declared_global |= set(node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        stack.extend(ast.iter_child_nodes(node))
    return names - declared_global


class _Renamer(ast.NodeTransformer):
    """Renames module-level names per ``mapping`` wherever they refer to the module binding."""

    def __init__(self, mapping: dict[str, str]):
        self.mapping = mapping
        self.shadowed: list[set[str]] = []

    def _hidden(self, name: str) -> bool:
        return any(name in s for s in self.shadowed)

    def visit_Name(self, node: ast.Name) -> ast.Name:
        if node.id in self.mapping and not self._hidden(node.id):
            node.id = self.mapping[node.id]
        return node

    def _scope(self, node: ast.AST) -> ast.AST:
        # decorators, defaults and annotations are evaluated in the enclosing scope
        for field_name in ("decorator_list", "returns", "bases", "keywords"):
            value = getattr(node, field_name, None)
            if isinstance(value, list):
                setattr(node, field_name, [self.visit(v) for v in value])
            elif isinstance(value, ast.AST):
                setattr(node, field_name, self.visit(value))
        if hasattr(node, "args") and isinstance(node.args, ast.arguments):
            a = node.args
            a.defaults = [self.visit(d) for d in a.defaults]
            a.kw_defaults = [None if d is None else self.visit(d) for d in a.kw_defaults]
            for arg in a.posonlyargs + a.args + a.kwonlyargs + [x for x in (a.vararg, a.kwarg) if x]:
                if arg.annotation is not None:
                    arg.annotation = self.visit(arg.annotation)
            self.shadowed.append(_function_locals(node))
        else:
            self.shadowed.append(set())                 # class bodies see module names
        if isinstance(node, ast.Lambda):
            node.body = self.visit(node.body)
        else:
            node.body = [self.visit(s) for s in node.body]
        self.shadowed.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and \
                not self.shadowed and node.name in self.mapping:
            node.name = self.mapping[node.name]
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda = _scope

    def visit_Global(self, node: ast.Global) -> ast.Global:
        node.names = [self.mapping.get(n, n) for n in node.names]
        return node


def parse_targets(source: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(op names in OVERRIDES, keys of CONFIG) read from dict literals; () where not literal or where
    the source does not parse (``persistent_engine.CandidateSource``, the one reader of the contract)."""
    declared = CandidateSource.parse(source)
    return declared.overrides, declared.config_keys


def select_compatible(parts: list[Part]) -> tuple[list[Part], list[Part]]:
    """Greedy in the given order (best first): keep a part unless an op or a CONFIG knob it sets is
    already owned by a kept part. Returns (kept, dropped)."""
    ops: set[str] = set()
    knobs: set[str] = set()
    kept, dropped = [], []
    for p in parts:
        if ops & set(p.targets) or knobs & set(p.config_keys):
            dropped.append(p)
            continue
        ops |= set(p.targets)
        knobs |= set(p.config_keys)
        kept.append(p)
    return kept, dropped


def compose(parts: list[Part]) -> str:
    """One candidate source with every part's OVERRIDES and CONFIG (later parts win per key)."""
    if not parts:
        return '"""tkcc plan: no accepted optimizations (the reference forward pass)."""\nOVERRIDES = {}\n'
    future: list[ast.stmt] = []
    body: list[ast.stmt] = []
    seen_imports: set[str] = set()
    defined: set[str] = set()
    overrides = ast.Dict(keys=[], values=[])
    config = ast.Dict(keys=[], values=[])
    spread_overrides: list[ast.expr] = []
    spread_config: list[ast.expr] = []
    descriptions = []
    for i, part in enumerate(parts):
        try:
            tree = ast.parse(part.source)
        except SyntaxError as e:
            raise ComposeError(f"part {part.name!r} does not parse: {e.msg} (line {e.lineno})") from None
        if tree.body and isinstance(tree.body[0], ast.Expr) and isinstance(
                getattr(tree.body[0], "value", None), ast.Constant) and isinstance(tree.body[0].value.value, str):
            tree.body = tree.body[1:]                    # drop the part's module docstring
        names = {n for s in tree.body if not isinstance(s, (ast.Import, ast.ImportFrom))
                 for n in _bound_names(s)}
        mapping = {n: f"_c{i}_{n}" for n in names if n in defined or n in SPECIAL}
        tree = _Renamer(mapping).visit(tree)
        for stmt in tree.body:
            if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
                key = ast.dump(stmt)
                if key not in seen_imports:
                    seen_imports.add(key)
                    future.append(stmt)
                continue
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                key = ast.dump(stmt)
                if key in seen_imports:
                    continue
                seen_imports.add(key)
            literal = _literal_target(stmt, (mapping.get("OVERRIDES"), mapping.get("CONFIG")))
            if literal is not None and literal == mapping.get("OVERRIDES"):      # fold its entries into the final literal
                overrides.keys += stmt.value.keys
                overrides.values += stmt.value.values
                continue
            if literal is not None and literal == mapping.get("CONFIG"):
                config.keys += stmt.value.keys
                config.values += stmt.value.values
                continue
            body.append(stmt)
            bound = _bound_names(stmt)
            if mapping.get("OVERRIDES") in bound:         # built some other way: spread it
                spread_overrides.append(ast.Name(id=mapping["OVERRIDES"], ctx=ast.Load()))
            if mapping.get("CONFIG") in bound:
                spread_config.append(ast.Name(id=mapping["CONFIG"], ctx=ast.Load()))
        defined |= {mapping.get(n, n) for n in names} | names
        descriptions.append(part.name)

    def final(name: str, literal: ast.Dict, spreads: list[ast.expr]) -> ast.stmt:
        d = ast.Dict(keys=[None] * len(spreads) + list(literal.keys), values=spreads + list(literal.values))
        return ast.Assign(targets=[ast.Name(id=name, ctx=ast.Store())], value=d, lineno=0)

    tail = [final("OVERRIDES", overrides, spread_overrides)]
    if config.keys or spread_config:
        tail.append(final("CONFIG", config, spread_config))
    tail.append(ast.Assign(targets=[ast.Name(id="DESCRIPTION", ctx=ast.Store())],
                           value=ast.Constant("composed: " + "; ".join(descriptions)), lineno=0))
    module = ast.Module(body=future + body + tail, type_ignores=[])
    header = '"""' + (f"tkcc composed plan: {len(parts)} accepted optimization(s): "
                      f"{', '.join(descriptions)}. Generated; do not edit.").replace('"', "'").replace("\\", "/") + '"""\n'
    return header + ast.unparse(ast.fix_missing_locations(module)) + "\n"


def _literal_target(stmt: ast.stmt, names: tuple[str | None, ...]) -> str | None:
    """The name among ``names`` that ``stmt`` assigns a dict literal with ** -free keys to, if any."""
    if not isinstance(stmt, (ast.Assign, ast.AnnAssign)) or not isinstance(stmt.value, ast.Dict):
        return None
    if any(k is None for k in stmt.value.keys):
        return None
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
    if len(targets) != 1 or not isinstance(targets[0], ast.Name):
        return None
    return targets[0].id if targets[0].id in names else None


_PDL_OFF = re.compile(r"^(\w+_PDL) = 0$", re.M)      # a template's PDL knob, as the composed source writes it


def with_pdl(source: str) -> str | None:
    """``source`` (a composed file) with every template's top-level ``<PREFIX>_PDL = 0`` set to 1, or None when it
    has none at 0. Programmatic dependent launch lets a kernel start while its predecessor finishes: it pays only
    where the neighbouring kernels use it too, so it is searched for the whole plan, not per op (on GPUs before
    SM90 and on CPU the templates ignore it)."""
    out, n = _PDL_OFF.subn(r"\1 = 1", source)
    return out if n else None
