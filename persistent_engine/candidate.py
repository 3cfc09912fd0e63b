"""Candidates: the one home of the candidate contract (DESIGN.md "Candidate"): reading what a source
declares (``CandidateSource.parse``, static), the static checks (DESIGN.md step 1), importing it as a
fresh module (``import_source``) and reading the contract off the live module (``read_contract``).
The judge and the compiler only ever parse (``ast``: nothing of the candidate runs); importing is for
the sandboxed executor, and for ``tkcc serve`` / ``compiler.plan.apply`` on a plan whose kernels were
verified and hash-checked.

A candidate is one Python file with ``OVERRIDES: dict[str, Callable]``, optional ``CONFIG: dict`` and
``DESCRIPTION: str``. ``static_check`` runs before any of its code does: it parses; the imports are
on an allowlist (no os, sys, subprocess, socket, ctypes, importlib...); names that dodge the import
policy (``__import__``, ``eval``, ``exec``, ``open``...) and introspection escapes
(``__globals__``, ``__subclasses__``...) are refused; ``OVERRIDES`` is a top-level assignment whose
literal keys name known ops, and functions it names by a literal have the reference's parameters.

The policy is a first line, not the guard: a determined candidate can still reach ``os`` through an
allowed module. What it then does (crash, hang, patch, spawn) is caught at run time by the engine's
guards and the supervisor's process isolation.

``load_candidate`` (the executor's) imports the source (``import_source``: a real file in a private
directory, since Triton's ``jit`` reads the source of kernels through ``inspect``, under a name made of
its hash) and checks ``OVERRIDES``/``CONFIG``/``DESCRIPTION`` and the signatures again on the live
objects (``read_contract``).
Stdlib only; the op signatures come from the caller (the engine reads them from the registry).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass, field
from types import ModuleType
from typing import Callable

ALLOWED_IMPORTS = frozenset({
    "torch", "triton", "math", "functools", "itertools", "operator", "typing", "dataclasses",
    "collections", "enum", "abc", "numbers", "contextlib", "warnings", "time", "threading",
    "random", "__future__",
})
FORBIDDEN_NAMES = frozenset({
    "__import__", "eval", "exec", "compile", "open", "globals", "breakpoint", "input", "vars",
    "__builtins__", "__loader__", "__spec__",
})
FORBIDDEN_ATTRS = frozenset({
    "__globals__", "__builtins__", "__subclasses__", "__bases__", "__mro__", "__code__",
    "__loader__", "__spec__", "__import__", "f_globals", "f_locals", "f_back", "gi_frame",
    # modules that libraries re-export as attributes (torch.os, torch.sys...)
    "os", "sys", "subprocess", "ctypes", "importlib", "builtins", "socket", "shutil",
})
# CONFIG knobs the engine knows (DESIGN.md); value types checked at load
CONFIG_KEYS: dict[str, tuple[type, ...]] = {
    "cuda_graph": (bool,),
    "cuda_graph_batch_sizes": (list,),
    "max_num_seqs": (int,),
    "max_num_batched_tokens": (int,),
    "max_chunk_tokens": (int,),
    "kv_block_size": (int,),
}
MAX_SOURCE_CHARS = 1_000_000
CONTRACT_NAMES = ("OVERRIDES", "CONFIG", "DESCRIPTION")     # the module attributes a candidate declares
DESCRIPTION_CHARS = 200                                     # CandidateSource.description: its first line, cut


@dataclass(frozen=True)
class CandidateSource:
    """What a candidate source declares, read statically (``ast``; none of its code runs): the op names
    its ``OVERRIDES`` dict literal names and the keys of its ``CONFIG`` literal (empty where the value is
    no dict literal; the last top-level assignment wins, as at import), and the first line of its
    ``DESCRIPTION`` string. ``parses`` is False for a source that does not parse (everything else empty)."""

    overrides: tuple[str, ...] = ()
    config_keys: tuple[str, ...] = ()
    description: str = ""
    parses: bool = True

    @classmethod
    def parse(cls, source: str) -> "CandidateSource":
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return cls(parses=False)
        found: dict[str, ast.expr] = {}
        for stmt in tree.body:
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
                for t in stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]:
                    if isinstance(t, ast.Name) and t.id in CONTRACT_NAMES:
                        found[t.id] = stmt.value
        desc = found.get("DESCRIPTION")
        text = desc.value.strip() if isinstance(desc, ast.Constant) and isinstance(desc.value, str) else ""
        return cls(overrides=_literal_keys(found.get("OVERRIDES")), config_keys=_literal_keys(found.get("CONFIG")),
                   description=text.splitlines()[0][:DESCRIPTION_CHARS] if text else "")


def _literal_keys(value: ast.expr | None) -> tuple[str, ...]:
    if not isinstance(value, ast.Dict):
        return ()
    return tuple(k.value for k in value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str))


class CandidateError(ValueError):
    user_error = True


@dataclass
class LoadedCandidate:
    name: str
    module: ModuleType
    overrides: dict[str, Callable]
    config: dict
    description: str
    path: str
    reasons: list[str] = field(default_factory=list)


def param_names(sig: inspect.Signature) -> list[str]:
    return [(("*" if p.kind is p.VAR_POSITIONAL else "**" if p.kind is p.VAR_KEYWORD else "") + p.name)
            for p in sig.parameters.values()]


def _ast_params(fn: ast.FunctionDef | ast.Lambda) -> list[str]:
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args]
    if a.vararg:
        names.append("*" + a.vararg.arg)
    names += [x.arg for x in a.kwonlyargs]
    if a.kwarg:
        names.append("**" + a.kwarg.arg)
    return names


# ---------------------------------------------------------------------------------- static
def static_check(source: str, op_params: dict[str, list[str]]) -> list[str]:
    """Reasons the source is refused before it runs (empty: it may be loaded).

    ``op_params``: op name -> the reference's parameter names, in order."""
    if not isinstance(source, str) or not source.strip():
        return ["static: empty source"]
    if len(source) > MAX_SOURCE_CHARS:
        return [f"static: source of {len(source)} characters exceeds {MAX_SOURCE_CHARS}"]
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        return [f"static: does not parse: line {e.lineno}: {e.msg}"]
    except (ValueError, RecursionError, MemoryError) as e:
        return [f"static: does not parse: {type(e).__name__}"]
    reasons: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if isinstance(node, ast.ImportFrom) and node.level:
                reasons.append(f"static: relative import at line {node.lineno} is not allowed")
                continue
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for m in mods:
                if m.split(".")[0] not in ALLOWED_IMPORTS:
                    reasons.append(f"static: forbidden import {m!r} at line {node.lineno} "
                                   f"(allowed: {', '.join(sorted(ALLOWED_IMPORTS - {'__future__'}))})")
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            reasons.append(f"static: forbidden name {node.id!r} at line {node.lineno}")
        elif isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_ATTRS:
            reasons.append(f"static: forbidden attribute {node.attr!r} at line {node.lineno}")
    functions = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    overrides = [n for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign)) and any(
        isinstance(t, ast.Name) and t.id == "OVERRIDES"
        for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))]
    if not overrides:
        reasons.append("static: no top-level OVERRIDES = {...} assignment")
        return reasons
    value = overrides[-1].value
    configs = [n.value for n in tree.body if isinstance(n, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == "CONFIG" for t in n.targets)]
    config_only = bool(configs) and isinstance(configs[-1], ast.Dict) and bool(configs[-1].keys)
    if isinstance(value, ast.Dict):
        if not value.keys and not config_only:      # a CONFIG-only candidate (engine/scheduler knobs) is one
            reasons.append("static: OVERRIDES is empty")
        for k, v in zip(value.keys, value.values):
            if not (isinstance(k, ast.Constant) and isinstance(k.value, str)):
                continue                        # checked on the live dict after loading
            if k.value not in op_params:
                reasons.append(f"static: OVERRIDES names unknown op {k.value!r} "
                               f"(known: {', '.join(sorted(op_params))})")
                continue
            fn = functions.get(v.id) if isinstance(v, ast.Name) else v if isinstance(v, ast.Lambda) else None
            # a decorated function may change its signature: checked on the live object instead
            if fn is not None and not getattr(fn, "decorator_list", []):
                got, want = _ast_params(fn), op_params[k.value]
                if got != want:
                    reasons.append(f"static: signature of {k.value} override ({', '.join(got)}) does not "
                                   f"match the reference ({', '.join(want)})")
    return reasons


# ---------------------------------------------------------------------------------- loading
from persistent_engine.scratch import MODULE_DIR_PREFIX  # noqa: E402 - stdlib only; where modules go


def module_name(source: str) -> str:
    """The module name of a candidate file, judged or served alike (harness-blind: a kernel that reads its
    ``__name__`` learns only its own source's hash)."""
    return "kernels_" + hashlib.sha256(source.encode()).hexdigest()[:16]


def import_source(source: str, directory: str) -> ModuleType:
    """``source`` imported as the fresh module ``module_name(source)`` from a real file in ``directory``
    (registered in ``sys.modules``: ``triton.jit`` and dataclasses look modules up by name). Runs its
    top-level code: only in a sandboxed executor, or on a verified plan's kernels. What that code
    raises propagates (the module is unregistered first)."""
    mod_name = module_name(source)
    path = os.path.join(directory, mod_name + ".py")
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(mod_name, None)
        raise
    return module


def read_contract(module: ModuleType, op_params: dict[str, list[str]] | None
                  ) -> tuple[dict[str, Callable], dict, str, list[str]]:
    """``(OVERRIDES, CONFIG, DESCRIPTION, reasons)`` of an imported candidate; ``reasons`` empty when it
    keeps the contract. With ``op_params`` (op -> the reference's parameter names) the full check of a
    candidate to judge: known ops, callables with the reference's signature, known CONFIG keys of the
    right type, not empty. Without it (a plan's composed kernels, judged already) only the shapes:
    OVERRIDES and CONFIG dicts, DESCRIPTION a string."""
    reasons: list[str] = []
    overrides = getattr(module, "OVERRIDES", None)
    config = getattr(module, "CONFIG", {})
    description = getattr(module, "DESCRIPTION", "")
    if op_params is None:
        config = {} if config is None else config
        if not isinstance(overrides, dict):
            reasons.append("load: OVERRIDES must be a dict of op name -> callable")
        if not isinstance(config, dict):
            reasons.append("load: CONFIG must be a dict")
        if not isinstance(description, str):
            reasons.append("load: DESCRIPTION must be a string")
        return (dict(overrides) if isinstance(overrides, dict) else {}, dict(config) if isinstance(config, dict)
                else {}, description if isinstance(description, str) else "", reasons)
    config_only = isinstance(config, dict) and bool(config)
    if not isinstance(overrides, dict) or not (overrides or config_only):
        reasons.append("load: OVERRIDES must be a non-empty dict of op name -> callable "
                       "(or empty beside a non-empty CONFIG)")
        overrides = {}
    for op, fn in overrides.items():
        if not isinstance(op, str) or op not in op_params:
            reasons.append(f"load: OVERRIDES names unknown op {op!r}")
        elif not callable(fn):
            reasons.append(f"load: OVERRIDES[{op!r}] is not callable")
        else:
            try:
                got = param_names(inspect.signature(fn))
            except (TypeError, ValueError):
                got = None
            if got != op_params[op]:
                reasons.append(f"load: signature of {op} override ({', '.join(got or ['?'])}) does "
                               f"not match the reference ({', '.join(op_params[op])})")
    if not isinstance(config, dict):
        reasons.append("load: CONFIG must be a dict")
        config = {}
    for key, value in config.items():
        if key not in CONFIG_KEYS:
            reasons.append(f"load: unknown CONFIG key {key!r} (known: {', '.join(CONFIG_KEYS)})")
        elif not isinstance(value, CONFIG_KEYS[key]) or isinstance(value, bool) != (CONFIG_KEYS[key] == (bool,)):
            reasons.append(f"load: CONFIG[{key!r}] has the wrong type {type(value).__name__}")
    if not isinstance(description, str):
        reasons.append("load: DESCRIPTION must be a string")
        description = ""
    return dict(overrides), dict(config), description, reasons


def load_candidate(source: str, name: str, directory: str,
                   op_params: dict[str, list[str]]) -> LoadedCandidate | list[str]:
    """Import ``source`` as a fresh module; returns the candidate, or the reasons it was refused.

    Runs the candidate's top-level code: call it only after ``static_check`` passed and with the
    engine's guards armed (the executor does). Exceptions raised by that code become reasons, never escape."""
    try:
        module = import_source(source, directory)
    except BaseException as e:  # noqa: BLE001 - SystemExit and KeyboardInterrupt from a candidate too
        return [f"load: import raised {type(e).__name__}: {e}"[:500]]
    overrides, config, description, reasons = read_contract(module, op_params)
    if reasons:
        sys.modules.pop(module.__name__, None)
        return reasons
    return LoadedCandidate(name=name, module=module, overrides=overrides, config=config,
                           description=description, path=module.__file__)


def unload_candidate(cand: LoadedCandidate) -> None:
    sys.modules.pop(cand.module.__name__, None)
    try:
        os.unlink(cand.path)
    except OSError:
        pass
