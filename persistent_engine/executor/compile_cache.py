"""Compiled step graphs kept per override set, compiled by a trusted executor, copied into candidates'.

In compiled mode (``compiled_step.py``) every candidate's executor compiles its timed step: inductor traces the
reference around the candidate's opaque calls and compiles the graphs between them. Those graphs depend on
which ops are overridden, not on the candidate's code (the calls are opaque), so every candidate overriding the
same ops needs the same graphs. Compiled in each fresh executor with a private cache they cost ~18 s per
candidate on the H100 (llama-1b fast tier, 2026-12-05; 190 candidates an hour); on CPU (tiny-dense) a fresh
compile took 32 s and one from a copied cache 5.9 s.

So the judge asks an executor that never loaded a candidate (``wire.Precompile``) to compile the step with the
reference functions of an op set opaque, kills it, and keeps its inductor and Triton caches under
``root/<op-set key>/``; each later executor of a candidate with that op set gets a copy of them in its own
workdir before it compiles (inductor then finds its graphs and Triton its kernels: it traces, loads, does not
compile). What is kept is trusted: no candidate code ever ran in the process that wrote it, and a candidate's
executor only ever writes its own copy (a cache shared with candidates would let one plant binaries that
others load). Copies take plain files and directories only (no link is followed), within ``MAX_BYTES``; a
Triton group file naming paths of the compiling executor is rewritten to the new workdir or left out.

Inductor's cached graphs name the compiling executor's own workdir too: its output code sets ``TRITON_CACHE_DIR``
to it and names every kernel's module path, next to which the autotuner writes ``.best_config`` (on the H100 a
seeded executor's compile raised EROFS on the compiling executor's path, 2026-12-06, and the step ran eagerly).
So ``keep`` records that path (``origin``) and ``seed`` rewrites it to the new executor's own path in every
file: byte for byte where both paths have the same length (pickled entries stay valid; an executor's workdir
is ``tkcc-exec-`` and eight random characters under one judge's directory), in any Python source otherwise,
and a binary file naming it at another length is left out (inductor compiles what it misses).

Layout: ``root/<key>/inductor/...`` (``TORCHINDUCTOR_CACHE_DIR``) and ``root/<key>/triton/<entry>/``
(``TRITON_CACHE_DIR``), each key's directory landing by one rename.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from typing import Iterable, Mapping

from persistent_engine.executor.kernel_cache import _copy_entry
from persistent_engine.executor.sandbox import ENV_WORKDIR

__all__ = ["CompileCache", "op_set_key", "op_sets_by_time", "ahead_op_sets", "MAX_BYTES"]

# single-op sets compiled once the baseline is profiled, before any candidate asks (``op_sets_by_time``); on
# CPU none (compiled mode is off there by default, and each costs ~30 s of a 2-core machine); the env overrides
AHEAD_OP_SETS = {"cuda": 8, "cpu": 0}
AHEAD_OP_SETS_ENV = "TKCC_AHEAD_OP_SETS"
MAX_BYTES = 256 << 20              # one op set's caches (llama-1b 2-layer fast tier: tens of MB); the workdir is 1 GiB
ORIGIN = "origin"                  # the compiling executor's own path of its workdir, which its caches name
DIRS = {"inductor": ENV_WORKDIR["TORCHINDUCTOR_CACHE_DIR"], "triton": ENV_WORKDIR["TRITON_CACHE_DIR"]}


def op_set_key(ops) -> str:
    """The key of an override set (order and repeats ignored; the empty set is the baseline's graphs)."""
    return hashlib.sha256("\n".join(sorted(set(ops))).encode()).hexdigest()[:32]


def _moved(data: bytes, name: str, move: tuple[bytes, bytes] | None) -> bytes | None:
    """``data`` with the path ``move[0]`` rewritten to ``move[1]`` (module doc); None: leave the file out."""
    if move is None or move[0] == move[1] or move[0] not in data:
        return data
    if len(move[0]) == len(move[1]) or name.endswith(".py"):
        return data.replace(move[0], move[1])
    return None


def _copy_tree(src: str, dst: str, budget: list[int], owner: int | None,
               move: tuple[bytes, bytes] | None = None) -> None:
    """Directories and regular files of ``src`` into ``dst`` (created), nothing followed, the path ``move[0]``
    rewritten to ``move[1]`` in them (``_moved``); files that would take ``budget[0]`` below zero are left out
    (inductor compiles what it misses)."""
    os.makedirs(dst, mode=0o755, exist_ok=True)
    if owner is not None:
        os.chown(dst, owner, owner)
    for name in sorted(os.listdir(src)):
        s, d = os.path.join(src, name), os.path.join(dst, name)
        st = os.lstat(s)
        if stat.S_ISDIR(st.st_mode):
            _copy_tree(s, d, budget, owner, move)
        elif stat.S_ISREG(st.st_mode) and st.st_size <= budget[0] and not os.path.lexists(d):
            with open(s, "rb") as f:
                data = _moved(f.read(st.st_size), name, move)
            if data is None:
                continue
            budget[0] -= len(data)
            with open(d, "wb") as f:
                f.write(data)
            if owner is not None:
                os.chown(d, owner, owner)


def _copy_triton(src: str, dst: str, owner: int | None, own_dst: str | None = None) -> None:
    """Triton cache entries (``<key>/<files>``) from ``src`` to ``dst``, group files re-pointed to ``own_dst``:
    the reader's own path of ``dst`` (an executor sees its tmpfs workdir at its own path, not at the judge's
    view of it; a group file naming the judge's view names files the executor cannot see). Default ``dst``."""
    os.makedirs(dst, mode=0o755, exist_ok=True)
    for entry in sorted(os.listdir(src)):
        final = os.path.join(dst, entry)
        if entry.startswith(".") or os.path.lexists(final):
            continue
        tmp = os.path.join(dst, f".{entry}.seed")
        if _copy_entry(os.path.join(src, entry), tmp, os.path.join(own_dst or dst, entry)):
            os.rename(tmp, final)
            if owner is not None:
                for path in [final, *(os.path.join(final, n) for n in os.listdir(final))]:
                    os.chown(path, owner, owner)


def ahead_op_sets(device_type: str) -> int:
    """How many op sets a judge on ``device_type`` compiles ahead: ``TKCC_AHEAD_OP_SETS`` when set (a count
    >= 0), else ``AHEAD_OP_SETS``."""
    raw = os.environ.get(AHEAD_OP_SETS_ENV, "").strip()
    return max(int(raw), 0) if raw.isdigit() else AHEAD_OP_SETS.get(device_type, 0)


def op_sets_by_time(per_point_ops: Iterable[Mapping[str, Mapping]], known: Iterable[str],
                    limit: int) -> list[tuple[str, ...]]:
    """The op sets to compile before any candidate asks for them: one per profiled op that has an override
    point (``known``), longest baseline time over the points first (``{op: {"ms": per-step ms, ...}}`` per
    point, as ``measure.profiler`` gives), at most ``limit``. Most candidates override one op, and the agents
    rank ops by the same profile; on the H100 (llama-1b, --budget 10m) 64% of the search's window went to
    loading candidates, 8.5 s each, their op set's graphs compiling while they waited."""
    names = set(known)
    total: dict[str, float] = {}
    for ops in per_point_ops:
        for op, row in ops.items():
            if op in names and float(row.get("ms") or 0.0) > 0:
                total[op] = total.get(op, 0.0) + float(row["ms"])
    return [(op,) for op in sorted(total, key=lambda o: (-total[o], o))[:max(limit, 0)]]


class CompileCache:
    """Trusted compiled graphs per op set under ``root`` (module doc). Not thread-safe: the judge's thread."""

    def __init__(self, root: str):
        self.root = root
        os.makedirs(root, mode=0o700, exist_ok=True)

    def has(self, key: str) -> bool:
        return os.path.isdir(os.path.join(self.root, key))

    def count(self) -> int:
        """Op sets kept."""
        return sum(1 for e in os.listdir(self.root) if not e.startswith("."))

    def keep(self, key: str, workdir: str, own_workdir: str | None = None) -> bool:
        """Keep the caches of the trusted executor whose workdir (the judge's view) is ``workdir`` and its own
        path of it ``own_workdir`` (default ``workdir``: what its caches name), killed after its ``Precompile``.
        False when nothing was there."""
        final = os.path.join(self.root, key)
        if os.path.isdir(final):
            return True
        tmp = os.path.join(self.root, f".{key}.new")
        shutil.rmtree(tmp, ignore_errors=True)
        found = False
        try:
            for name, sub in DIRS.items():
                src = os.path.join(workdir, sub)
                if os.path.isdir(src) and not os.path.islink(src):
                    if name == "triton":
                        _copy_triton(src, os.path.join(tmp, name), None)
                    else:
                        _copy_tree(src, os.path.join(tmp, name), [MAX_BYTES], None)
                    found = True
            if found:
                with open(os.path.join(tmp, ORIGIN), "w") as f:
                    f.write(own_workdir or workdir)
                os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return found

    def seed(self, key: str, workdir: str, owner: int | None = None, own_workdir: str | None = None) -> bool:
        """Copy op set ``key``'s caches into an executor's workdir (``workdir``: the judge's view; ``own_workdir``:
        the executor's own path of it, which Triton's group files must name, default ``workdir``) before it
        compiles; ``owner``: the executor's uid where it is not the judge's (inductor adds its own entries
        beside). False when the cache has none for ``key``."""
        kept = os.path.join(self.root, key)
        if not os.path.isdir(kept):
            return False
        with open(os.path.join(kept, ORIGIN)) as f:
            move = (f.read().encode(), (own_workdir or workdir).encode())
        for name, sub in DIRS.items():
            src = os.path.join(kept, name)
            if not os.path.isdir(src):
                continue
            if name == "triton":
                _copy_triton(src, os.path.join(workdir, sub), owner, os.path.join(own_workdir or workdir, sub))
            else:
                _copy_tree(src, os.path.join(workdir, sub), [MAX_BYTES], owner, move)
        return True
