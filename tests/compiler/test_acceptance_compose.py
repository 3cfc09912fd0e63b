"""Composition of accepted candidates into one source: name clashes, literal OVERRIDES, CONFIG merge,
and the composed file passes the engine's static policy and each op's contract."""

import ast

import pytest
import torch

from compiler.plan.compose import ComposeError, Part, compose, parse_targets, select_compatible

RMS = '''"""rms_norm in fp32 with one fewer temporary."""
from __future__ import annotations
import torch

SCALE = 1.0


def helper(x, weight, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight * SCALE


def rms_norm(x, weight, eps):
    return helper(x, weight, eps)


OVERRIDES = {"rms_norm": rms_norm}
CONFIG = {"max_num_seqs": 64}
DESCRIPTION = "rms"
'''

SILU = '''import torch

SCALE = 2.0   # a clashing global that must not leak into rms_norm's helper


def helper(x):
    d = x.shape[-1] // 2
    return torch.nn.functional.silu(x[..., :d]) * x[..., d:] * (SCALE / 2.0)


def silu_and_mul(x):
    SCALE = "local shadow"     # a local of the same name stays untouched
    return helper(x)


OVERRIDES = {"silu_and_mul": silu_and_mul}
'''


def load(source: str) -> dict:
    ns: dict = {"__name__": "composed_test"}
    exec(compile(source, "composed_test.py", "exec"), ns)  # noqa: S102 - test of generated source
    return ns


def test_composed_source_keeps_each_part_semantics_and_passes_contracts():
    from persistent_engine.candidate import static_check
    from persistent_engine.ops import registry
    from persistent_engine.ops.contract import check_op

    src = compose([Part("rms", RMS, ("rms_norm",), ("max_num_seqs",)), Part("silu", SILU, ("silu_and_mul",))])
    ns = load(src)
    assert set(ns["OVERRIDES"]) == {"rms_norm", "silu_and_mul"}
    assert ns["CONFIG"] == {"max_num_seqs": 64}
    assert ns["SCALE"] == 1.0 and ns["_c1_SCALE"] == 2.0
    x = torch.randn(3, 8)
    torch.testing.assert_close(ns["OVERRIDES"]["silu_and_mul"](x), registry.get("silu_and_mul").reference(x))
    for op in ("rms_norm", "silu_and_mul"):
        assert check_op(op, ns["OVERRIDES"][op], dtypes=(torch.float32,)) == []
    params = {n: list(__import__("inspect").signature(registry.get(n).reference).parameters)
              for n in registry.names()}
    assert static_check(src, params) == []
    # OVERRIDES is one literal dict at the end; the future import is first after the docstring
    tree = ast.parse(src)
    assert isinstance(tree.body[1], ast.ImportFrom) and tree.body[1].module == "__future__"
    last = [s for s in tree.body if isinstance(s, ast.Assign) and s.targets[0].id == "OVERRIDES"]
    assert len(last) == 1 and isinstance(last[0].value, ast.Dict) and None not in last[0].value.keys
    assert src.count("import torch") == 1


def test_non_literal_overrides_are_spread():
    part = "def f(x):\n    return x\n\nOVERRIDES = dict(silu_and_mul=f)\n"
    ns = load(compose([Part("a", RMS), Part("b", part)]))
    assert set(ns["OVERRIDES"]) == {"rms_norm", "silu_and_mul"}


def test_select_compatible_keeps_one_owner_per_op_and_knob():
    parts = [Part("best", "", ("rms_norm",), ("max_num_seqs",)), Part("clash-op", "", ("rms_norm", "linear")),
             Part("clash-knob", "", ("linear",), ("max_num_seqs",)), Part("ok", "", ("linear",))]
    kept, dropped = select_compatible(parts)
    assert [p.name for p in kept] == ["best", "ok"]
    assert [p.name for p in dropped] == ["clash-op", "clash-knob"]


def test_parse_targets_and_errors():
    assert parse_targets(RMS) == (("rms_norm",), ("max_num_seqs",))
    with pytest.raises(ComposeError, match="does not parse"):
        compose([Part("bad", "def (:\n")])
    assert load(compose([]))["OVERRIDES"] == {}


def test_a_composition_refused_for_the_budget_is_not_called_incorrect():
    from compiler.search.acceptance import _why_dropped
    from compiler.fleet.local import cut_by_deadline, failed_verdict

    ok = type("V", (), {"correct": True, "reasons": [], "speedup": 1.0})()
    hang = failed_verdict("hang: no answer during bench within 3 s")
    assert _why_dropped(failed_verdict("not evaluated: the run's budget is spent"), None) == \
        "not measured when composed: the run's budget ran out"
    assert _why_dropped(failed_verdict("layer-level: logits differ"), None) == "incorrect when composed"
    assert _why_dropped(ok, cut_by_deadline(hang, 0.5)) == \
        "not measured when composed: the run's budget ran out"          # cut at the deadline
    assert _why_dropped(ok, hang) == "incorrect when composed"           # a hang within its own timeout
    assert _why_dropped(ok, ok) == "no gain when composed"
