"""Parametrised kernel templates and their rendering into candidate source files.

A *template* is one implementation strategy of one registry op (``rms_norm`` as a row-blocked Triton
kernel, ``linear`` as a split-K GEMV, ``attention_decode`` as vectorised torch...). Its code lives in
one file under ``agents/templates/kernels/`` written as ordinary Python, so it can be read, linted and
imported directly. The file has two parts, separated by the line ``# ---- section ----``:

- a header (docstring and the imports a candidate may use: torch, triton, triton.language, math);
- the *section*: module-level knob assignments (``RMSN_BLOCK_D = 1024``), kernels and the entry
  function with the op's exact reference signature.

Rendering a template with chosen knob values rewrites the knob assignments of the section in place
(each knob must be assigned exactly once, on one line) and inlines the section into the candidate,
so a candidate is one self-contained file with no tkcc import (DESIGN.md "Candidate"). A header may also
import names from a *shared* file of this folder (``from agents.templates.kernels.shared_gemv import ...``:
functions a family of templates has in common, with no knobs): the renderer inlines the ones the
candidate's templates name, and what those call, once per candidate after the sections (module-level
definitions, resolved when a kernel first runs), so the template file still imports and runs as it is
and the candidate still imports nothing of tkcc. Identifiers in
a section carry a prefix unique to the file, so several sections can share one candidate. Several
templates may share one file (one kernel with a constexpr knob, an entry and a knob prefix each): a
candidate then holds that section once, with every chosen template's knobs set in it.

A knob setting is *valid* when every value is one of the knob's values and the template's
``constraint`` (register budget, shape fit) accepts it; ``Template.check`` returns the reasons it is
not, one string each.
"""

from __future__ import annotations

import ast
import hashlib
import json
import linecache
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

KERNEL_DIR = Path(__file__).with_name("kernels")
SECTION_MARK = "# ---- section ----"
ALLOWED_IMPORTS = ("import math", "import torch", "import triton", "import triton.language as tl")
SHARED_IMPORT = "from agents.templates.kernels."     # a header line naming a shared file to inline

# constraint(knobs, dims) -> list of reasons; dims are model sizes (hidden, intermediate, head_dim...)
Constraint = Callable[[Mapping[str, Any], Mapping[str, int]], list]


class TemplateError(ValueError):
    """A template name, knob or value that does not exist; a bad knob setting."""

    user_error = True


@dataclass(frozen=True)
class Knob:
    """One tunable parameter: the module-level name in the kernel file and its allowed values."""

    name: str
    values: tuple

    def __post_init__(self):
        if not self.values:
            raise ValueError(f"knob {self.name} needs at least one value")


@dataclass(frozen=True)
class Template:
    """One implementation of one op, with its knob space.

    ``backend`` is "triton" (needs CUDA, or ``TRITON_INTERPRET=1`` for correctness only) or "torch"
    (any device). ``devices`` lists where it is worth timing ("cuda", "cpu").
    """

    name: str                           # unique, "<op>.<strategy>"
    op: str                             # registry op it overrides
    file: str                           # kernel file name under kernels/
    entry: str                          # function in that file with the op's signature
    backend: str                        # "triton" | "torch"
    devices: tuple[str, ...]
    knobs: tuple[Knob, ...]
    description: str
    constraint: Constraint | None = field(default=None, compare=False, repr=False)

    # ------------------------------------------------------------------ knob space
    def knob(self, name: str) -> Knob:
        for k in self.knobs:
            if k.name == name:
                return k
        raise TemplateError(f"template {self.name} has no knob {name!r}")

    def default(self) -> dict:
        """The first value of every knob (the library lists a sensible default first)."""
        return {k.name: k.values[0] for k in self.knobs}

    def space_size(self) -> int:
        n = 1
        for k in self.knobs:
            n *= len(k.values)
        return n

    def check(self, knobs: Mapping[str, Any], dims: Mapping[str, int] | None = None) -> list[str]:
        """Reasons why ``knobs`` is not a valid setting (empty list: valid)."""
        reasons = []
        names = {k.name for k in self.knobs}
        for key in knobs:
            if key not in names:
                reasons.append(f"{self.name}: unknown knob {key}")
        for k in self.knobs:
            if k.name not in knobs:
                reasons.append(f"{self.name}: knob {k.name} missing")
            elif knobs[k.name] not in k.values:
                reasons.append(f"{self.name}: {k.name}={knobs[k.name]!r} not in {list(k.values)}")
        if not reasons and self.constraint is not None:
            reasons.extend(f"{self.name}: {r}" for r in self.constraint(knobs, dims or {}))
        return reasons

    def available_on(self, device: str) -> bool:
        return device in self.devices

    # ------------------------------------------------------------------ rendering
    def set_knobs(self, text: str, knobs: Mapping[str, Any]) -> str:
        """``text`` (the section of this template's file) with this template's knob assignments rewritten
        to ``knobs`` (each assigned exactly once, on one line)."""
        bad = self.check(knobs)
        if bad:
            raise TemplateError("; ".join(bad))
        for k in self.knobs:
            pattern = re.compile(rf"^{re.escape(k.name)} = .*$", re.MULTILINE)
            text, n = pattern.subn(f"{k.name} = {knobs[k.name]!r}", text)
            if n != 1:
                raise TemplateError(f"{self.file}: knob {k.name} assigned {n} times (need exactly 1)")
        return text


@dataclass(frozen=True)
class Choice:
    """A template with a knob setting: one override of a candidate."""

    template: Template
    knobs: Mapping[str, Any]

    @property
    def op(self) -> str:
        return self.template.op

    def key(self) -> str:
        """Stable text naming this choice (idea titles, dedup): ``name{k=v,...}``."""
        inner = ",".join(f"{k}={self.knobs[k]}" for k in sorted(self.knobs))
        return f"{self.template.name}{{{inner}}}"

    def digest(self) -> str:
        return hashlib.sha1(self.key().encode()).hexdigest()[:10]

    def to_dict(self) -> dict:
        return {"template": self.template.name, "op": self.op, "knobs": dict(self.knobs)}


@lru_cache(maxsize=None)
def _section(file: str) -> tuple[tuple[tuple[str, tuple[str, ...]], ...], str]:
    """(the shared files ``file``'s header imports, each with the names it takes; ``file``'s section)."""
    path = KERNEL_DIR / file
    text = path.read_text()
    head, mark, body = text.partition(SECTION_MARK)
    if not mark:
        raise TemplateError(f"{path} has no '{SECTION_MARK}' line")
    shared = []
    for line in head.splitlines():
        if line.startswith(SHARED_IMPORT):
            node = ast.parse(line).body[0]
            name = node.module.rsplit(".", 1)[1] + ".py"
            if not (KERNEL_DIR / name).is_file() or _section(name)[0]:
                raise TemplateError(f"{path}: {name} is not a shared kernel file of {KERNEL_DIR}")
            shared.append((name, tuple(a.name for a in node.names)))
        elif line.startswith(("import ", "from ")) and line.strip() not in ALLOWED_IMPORTS:
            raise TemplateError(f"{path}: import not allowed in a candidate: {line.strip()}")
    return tuple(shared), body.strip("\n") + "\n"


@lru_cache(maxsize=None)
def _shared_text(file: str, names: frozenset) -> str:
    """The definitions of shared ``file`` that ``names`` need (those named and what they call, transitively), in
    the file's order: a candidate holds only the shared kernels its templates use."""
    body = _section(file)[1]
    lines = body.splitlines()
    defs = {}                                   # name -> (first line incl. decorators, last line, names it uses)
    for node in ast.parse(body).body:
        if not isinstance(node, ast.FunctionDef):
            raise TemplateError(f"{file}: a shared section holds functions only, not {type(node).__name__}")
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        defs[node.name] = (first, node.end_lineno, {n.id for n in ast.walk(node) if isinstance(n, ast.Name)})
    missing = names - defs.keys()
    if missing:
        raise TemplateError(f"{file} defines no {', '.join(sorted(missing))}")
    need, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name not in need:
            need.add(name)
            todo += [n for n in defs[name][2] if n in defs]
    chosen = ["\n".join(lines[first - 1:last]) for name, (first, last, _) in defs.items() if name in need]
    return "\n\n\n".join(chosen) + "\n"


def render_candidate(choices: Sequence[Choice], *, config: Mapping[str, Any] | None = None,
                     description: str | None = None) -> str:
    """One self-contained candidate source: imports, each choice's section, ``OVERRIDES``,
    optional ``CONFIG`` and ``DESCRIPTION``. At most one choice per op."""
    ops = [c.op for c in choices]
    if len(set(ops)) != len(ops):
        raise TemplateError(f"two choices override the same op: {ops}")
    if not choices and not config:
        raise TemplateError("a candidate needs at least one override or a CONFIG")
    desc = description or "; ".join(c.key() for c in choices) or "engine configuration"
    parts = [f'"""tkcc candidate rendered from the template library: {_one_line(desc)}"""', ""]
    parts += list(ALLOWED_IMPORTS) + ["", ""]
    by_file: dict[str, list[Choice]] = {}       # templates of one file (one kernel, several entries) share
    for c in choices:                           # its section once, each with its own knobs set in it
        by_file.setdefault(c.template.file, []).append(c)
    shared: dict[str, set] = {}                 # each shared file once, with every name its templates take
    for file in by_file:
        for name, names in _section(file)[0]:
            shared.setdefault(name, set()).update(names)
    for same in by_file.values():
        text = _section(same[0].template.file)[1]
        for c in same:
            text = c.template.set_knobs(text, c.knobs)
        parts.append(f"# ======== {'; '.join(c.key() for c in same)}")
        parts.append(text)
        parts.append("")
    for name, names in shared.items():          # after the sections: a reader (or a cut) meets the template first
        parts += [f"# ======== shared kernels the sections above call: {name}",
                  _shared_text(name, frozenset(names)), ""]
    overrides = ", ".join(f"{c.op!r}: {c.template.entry}" for c in choices)
    parts.append(f"OVERRIDES = {{{overrides}}}")
    if config:
        parts.append(f"CONFIG = {json.dumps(dict(config), sort_keys=True)}")
    parts.append(f"DESCRIPTION = {desc!r}")
    source = "\n".join(parts) + "\n"
    ast.parse(source)      # a rendering bug must surface here, not in the engine
    return source


def load_candidate(source: str, name: str = "tkcc_candidate") -> dict:
    """Execute a candidate source as a fresh module namespace (tests, benchmarks, local timing).

    The source is registered with ``linecache`` under a name unique to its digest, because
    ``triton.jit`` reads a kernel's source through ``inspect``."""
    filename = f"<{name}-{hashlib.sha1(source.encode()).hexdigest()[:12]}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict[str, Any] = {"__name__": name, "__file__": filename}
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - our own rendered source
    return namespace


def _one_line(text: str) -> str:
    return " ".join(text.split()).replace('"""', "'''")
