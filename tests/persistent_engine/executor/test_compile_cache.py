"""persistent_engine/executor/compile_cache.py: a trusted executor's inductor and Triton caches are kept per op
set and copied into a later executor's workdir (another path: Triton's group files re-pointed to it), nothing
followed through a link, nothing over the budget; the key ignores order and repeats. The engine path (a
candidate's executor seeded from a trusted compile) runs in test_compiled_baseline.py."""

from __future__ import annotations

import json
import os

from persistent_engine.executor import compile_cache as cc
from persistent_engine.executor.compile_cache import CompileCache, op_set_key


def _executor_workdir(root, inner="/inner/exec-a"):
    """A workdir as a compiled executor leaves it: an FX-graph entry, a Triton kernel whose group file names
    the executor's own path of it (not the judge's view)."""
    ind = root / "inductor" / "fxgraph" / "ab" / "fabc"
    ind.mkdir(parents=True)
    (ind / "entry").write_bytes(b"graph")
    tri = root / "triton" / "KEY1"
    tri.mkdir(parents=True)
    (tri / "k.cubin").write_bytes(b"\x7fELF")
    (tri / "__grp__k.json").write_text(json.dumps({"child_paths": {"k.cubin": f"{inner}/triton/KEY1/k.cubin"}}))
    return root


def test_an_op_set_key_ignores_order_and_repeats():
    assert op_set_key(["linear", "rms_norm"]) == op_set_key(("rms_norm", "linear", "linear"))
    assert op_set_key(["linear"]) != op_set_key(["rms_norm"]) != op_set_key([])


def test_kept_caches_seed_another_workdir_with_groups_repointed(tmp_path):
    cache = CompileCache(str(tmp_path / "root"))
    key = op_set_key(["rms_norm"])
    assert not cache.has(key) and not cache.seed(key, str(tmp_path / "nowhere"))
    assert cache.keep(key, str(_executor_workdir(tmp_path / "a"))) and cache.has(key) and cache.count() == 1
    dst = tmp_path / "b"
    (dst / "triton").mkdir(parents=True)
    assert cache.seed(key, str(dst))
    assert (dst / "inductor" / "fxgraph" / "ab" / "fabc" / "entry").read_bytes() == b"graph"
    group = json.loads((dst / "triton" / "KEY1" / "__grp__k.json").read_text())["child_paths"]
    assert group == {"k.cubin": str(dst / "triton" / "KEY1" / "k.cubin")}
    assert not any(n.startswith(".") for n in os.listdir(dst / "triton"))
    # a sandboxed executor sees its tmpfs workdir at its own path, not at the judge's view of it (/proc/<pid>/fd/N):
    # the group files name what it sees, or Triton finds none of the kernel's files (H100, 2026-12-06)
    view = tmp_path / "view-of-c"
    (view / "triton").mkdir(parents=True)
    assert cache.seed(key, str(view), own_workdir="/inner/exec-c")
    group = json.loads((view / "triton" / "KEY1" / "__grp__k.json").read_text())["child_paths"]
    assert group == {"k.cubin": "/inner/exec-c/triton/KEY1/k.cubin"}


def test_inductor_files_naming_the_compiling_executor_are_moved_to_the_new_one(tmp_path):
    """Inductor's output code sets TRITON_CACHE_DIR to the compiling executor's own workdir and names its kernel
    modules there (the autotuner writes beside them): seeded, they name the new executor's own path (H100,
    2026-12-06: EROFS on the old path, the step eager). A binary entry naming it at another length is left out."""
    work = _executor_workdir(tmp_path / "a")
    code = b"os.environ['TRITON_CACHE_DIR'] = '/inner/exec-a/triton'\n# kernel path: /inner/exec-a/inductor/um/k.py\n"
    (work / "inductor" / "out.py").write_bytes(code)
    (work / "inductor" / "fxgraph" / "ab" / "fabc" / "pickled").write_bytes(b"\x80\x05X\x0c\x00\x00\x00/inner/exec-a.")
    cache = CompileCache(str(tmp_path / "root"))
    key = op_set_key(["linear"])
    assert cache.keep(key, str(work), own_workdir="/inner/exec-a")
    same, longer = tmp_path / "c", tmp_path / "d"
    assert cache.seed(key, str(same), own_workdir="/inner/exec-c")
    assert (same / "inductor" / "out.py").read_bytes() == code.replace(b"exec-a", b"exec-c")
    assert (same / "inductor" / "fxgraph" / "ab" / "fabc" / "pickled").read_bytes().endswith(b"/inner/exec-c.")
    assert cache.seed(key, str(longer), own_workdir="/inner/exec-longer")
    assert b"/inner/exec-longer/triton" in (longer / "inductor" / "out.py").read_bytes()
    assert not (longer / "inductor" / "fxgraph" / "ab" / "fabc" / "pickled").exists()
    assert (longer / "inductor" / "fxgraph" / "ab" / "fabc" / "entry").read_bytes() == b"graph"


def test_links_are_not_followed_and_the_budget_holds(tmp_path, monkeypatch):
    secret = tmp_path / "secret"
    secret.write_bytes(b"host file")
    work = _executor_workdir(tmp_path / "a")
    os.symlink(secret, work / "inductor" / "fxgraph" / "link")
    os.symlink(tmp_path, work / "inductor" / "dirlink")
    (work / "inductor" / "big").write_bytes(b"x" * 64)
    monkeypatch.setattr(cc, "MAX_BYTES", 16)
    cache = CompileCache(str(tmp_path / "root"))
    key = op_set_key([])
    assert cache.keep(key, str(work))
    kept = tmp_path / "root" / key / "inductor"
    assert not os.path.lexists(kept / "fxgraph" / "link") and not os.path.lexists(kept / "dirlink")
    assert not (kept / "big").exists() and (kept / "fxgraph" / "ab" / "fabc" / "entry").exists()


def test_the_op_sets_compiled_ahead_are_the_profiled_ops_longest_first(monkeypatch):
    """``Engine.profile`` queues these: one set per op with an override point, by baseline time over the
    points, ties by name, within the limit; ops without time or without an override point are not."""
    points = [{"attention_decode": {"ms": 0.5, "calls": 2}, "linear": {"ms": 0.3}, "zero": {"ms": 0.0}},
              {"linear": {"ms": 0.4}, "rms_norm": {"ms": 0.2}, "not_an_op": {"ms": 9.0}, "lm_head": {"ms": 0.2}}]
    known = ["attention_decode", "linear", "rms_norm", "lm_head", "zero"]
    assert cc.op_sets_by_time(points, known, 8) == [("linear",), ("attention_decode",), ("lm_head",), ("rms_norm",)]
    assert cc.op_sets_by_time(points, known, 1) == [("linear",)] and cc.op_sets_by_time(points, known, 0) == []
    monkeypatch.delenv(cc.AHEAD_OP_SETS_ENV, raising=False)
    assert cc.ahead_op_sets("cuda") == 8 and cc.ahead_op_sets("cpu") == 0
    monkeypatch.setenv(cc.AHEAD_OP_SETS_ENV, "3")
    assert cc.ahead_op_sets("cpu") == 3


def test_a_candidates_op_set_is_compiled_before_those_queued_ahead(monkeypatch, tmp_path):
    """``ExecutorSide._precompile``: the op sets a candidate needs go to the front, in their order; those of
    the profile (``ahead``) behind them; none twice. No compile starts here (the limit is 0)."""
    import torch

    from persistent_engine.judge import executors

    monkeypatch.setitem(executors.PRECOMPILE, "cpu", 0)
    side = object.__new__(executors.ExecutorSide)
    side.device, side.pool = torch.device("cpu"), None
    side._precompiling, side._precompile_wanted, side.precompile_failed = {}, [], set()
    side.compile_cache = CompileCache(str(tmp_path / "compiled"))
    side._precompile([("linear",), ("attention_decode",), ("rms_norm",)], ahead=True)
    side._precompile([("rms_norm",), ("silu_and_mul",)])
    assert side._precompile_wanted == [("rms_norm",), ("silu_and_mul",), ("linear",), ("attention_decode",)]
