"""Composite ops (add_rms_norm_linear, silu_mul_linear; add_rms_norm_qkv_rotary has its own file): reference = composition, the default dispatches
through the registry (fine-op overrides reach inside), an override of the composite replaces the whole
fusion, the decoder's call sites and shapes, and the profiler's outermost attribution."""

import collections

import pytest
import torch
import torch.nn.functional as F

from persistent_engine.measure import profiler
from persistent_engine.models.decoder import build_model
from persistent_engine.models.spec import ModelSpec
from persistent_engine.ops import registry
from persistent_engine.ops.contract import check_op
from persistent_engine.inputs.workloads import make_workload
from persistent_engine.io_struct import WorkloadPoint

COMPOSITES = ("add_rms_norm_linear", "silu_mul_linear")
DECODE = WorkloadPoint(phase="decode", batch=2, context=10, chunk=1, weight=1.0)


def _ref(name):
    return registry.get(name).reference


def _inputs(name, shape_i=0, dtype=torch.float32, seed=0):
    d = registry.get(name)
    return d.make_inputs(d.examples[shape_i], dtype, "cpu", seed)


@pytest.fixture(autouse=True)
def _no_overrides_left():
    yield
    assert registry.active_overrides() == {}


# ----------------------------------------------------------------------------- the ops themselves
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape_i", [0, 1, 2])
def test_reference_is_the_composition_of_the_fine_references(dtype, shape_i):
    x, r, nw, eps, w, b = _inputs("add_rms_norm_linear", shape_i, dtype)
    normed, new_r = _ref("fused_add_rms_norm")(x, r, nw, eps)
    out, res = _ref("add_rms_norm_linear")(x, r, nw, eps, w, b)
    assert torch.equal(out, _ref("linear")(normed, w, b)) and torch.equal(res, new_r)
    assert out.dtype == res.dtype == dtype and out.shape == (x.shape[0], w.shape[0]) and res.shape == x.shape
    g, wd = _inputs("silu_mul_linear", shape_i, dtype)
    y = _ref("silu_mul_linear")(g, wd)
    assert torch.equal(y, _ref("linear")(_ref("silu_and_mul")(g), wd, None)) and y.dtype == dtype


def test_reference_matches_an_independent_float64_formula():
    x, r, nw, eps, w, b = (a.double() if isinstance(a, torch.Tensor) else a for a in _inputs("add_rms_norm_linear", 1))
    s = x + r
    want = (s / (s.pow(2).mean(-1, keepdim=True) + eps).sqrt() * nw) @ w.t() + b
    out, res = _ref("add_rms_norm_linear")(x, r, nw, eps, w, b)
    assert torch.allclose(out, want, atol=1e-10) and torch.equal(res, s)
    g, wd = (a.double() for a in _inputs("silu_mul_linear", 2))
    i = g.shape[-1] // 2
    assert torch.allclose(_ref("silu_mul_linear")(g, wd), (F.silu(g[:, :i]) * g[:, i:]) @ wd.t(), atol=1e-10)


@pytest.mark.parametrize("name", COMPOSITES)
def test_default_is_what_runs_and_passes_the_contract(name):
    d = registry.get(name)
    assert d.composite and d.baseline is d.default and registry.current(name) is d.default
    assert not registry.get("linear").composite and registry.get("linear").baseline is _ref("linear")
    assert check_op(name, d.default) == []


def test_known_bad_composites_are_rejected_by_the_contract():
    def swapped(x, r, nw, eps, w, b):
        out, res = _ref("add_rms_norm_linear")(x, r, nw, eps, w, b)
        return out, x.clone()                          # the un-added input instead of x + residual
    assert any("mismatch: output 1" in m for m in check_op("add_rms_norm_linear", swapped))

    def one_output(*args):
        return _ref("add_rms_norm_linear")(*args)[0]
    assert any("output count" in m for m in check_op("add_rms_norm_linear", one_output))

    def no_norm_weight(x, r, nw, eps, w, b):
        return _ref("add_rms_norm_linear")(x, r, torch.ones_like(nw), eps, w, b)
    reasons = check_op("add_rms_norm_linear", no_norm_weight, dtypes=(torch.float32,))
    assert reasons and all("mismatch: output 0" in m for m in reasons)

    def gate_up_swapped(x, w):
        return _ref("silu_mul_linear")(x.roll(x.shape[-1] // 2, dims=-1), w)
    assert any("mismatch" in m for m in check_op("silu_mul_linear", gate_up_swapped))


def test_default_dispatches_through_fine_op_overrides():
    seen = collections.Counter()

    def doubled_linear(x, w, b):
        seen["linear"] += 1
        return _ref("linear")(x, w, b) * 2

    def halved_silu(x):
        seen["silu_and_mul"] += 1
        return _ref("silu_and_mul")(x) / 2
    args = _inputs("add_rms_norm_linear", 1)
    out, res = _ref("add_rms_norm_linear")(*args)
    g, wd = _inputs("silu_mul_linear", 0)
    with registry.override({"linear": doubled_linear, "silu_and_mul": halved_silu}):
        o2, r2 = registry.call("add_rms_norm_linear", *args)
        y2 = registry.call("silu_mul_linear", g, wd)
    assert seen == {"linear": 2, "silu_and_mul": 1}
    assert torch.allclose(o2, out * 2, atol=1e-5) and torch.equal(r2, res)
    assert torch.allclose(y2, _ref("silu_mul_linear")(g, wd), atol=1e-5)     # x2 then /2: same again


def test_overriding_the_composite_bypasses_the_fine_ops():
    def boom(*args):
        raise AssertionError("a fine op ran inside an overridden composite")
    fused = {n: (lambda *a, _n=n: _ref(_n)(*a)) for n in COMPOSITES}
    args, (g, wd) = _inputs("add_rms_norm_linear", 0), _inputs("silu_mul_linear", 0)
    with registry.override({"linear": boom, "fused_add_rms_norm": boom, "silu_and_mul": boom, **fused}):
        out, res = registry.call("add_rms_norm_linear", *args)
        y = registry.call("silu_mul_linear", g, wd)
    assert torch.equal(out, _ref("add_rms_norm_linear")(*args)[0]) and torch.equal(y, _ref("silu_mul_linear")(g, wd))
    assert registry.current("add_rms_norm_linear") is registry.get("add_rms_norm_linear").default   # restored


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_zero_residual_is_exactly_a_plain_norm(dtype):
    """Layer 0 now runs fused_add_rms_norm(x, 0): it must equal rms_norm(x) bitwise (same logits as before)."""
    x, w, eps = registry.get("rms_norm").make_inputs({"x": [7, 100]}, dtype, "cpu", 3)
    normed, res = _ref("fused_add_rms_norm")(x, torch.zeros_like(x), w, eps)
    assert torch.equal(normed, _ref("rms_norm")(x, w, eps)) and torch.equal(res, x)


# ----------------------------------------------------------------------------- shapes and call sites
def _llama_slice():
    spec = ModelSpec.from_name("llama-1b").replace(vocab_size=512)        # real layer shapes, small vocab
    return build_model(spec, layers=[0, 1])


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    return {"tiny-dense": build_model("tiny-dense"), "tiny-moe": build_model("tiny-moe"),
            "tiny-mla": build_model("tiny-mla"), "llama-1b": _llama_slice()}


# per model: top-level (add_rms_norm_linear, silu_mul_linear, add_rms_norm_qkv_rotary) calls per decode step
EXPECTED_CALLS = {"tiny-dense": (2, 2, 2),             # 2 dense GQA layers without QK-norm: gate_up, down, qkv+rope
                  "tiny-moe": (3 + 1, 1 + 2, 0),       # QK-norm: qkv x3, dense gate_up; dense down, shared down x2
                  "tiny-mla": (1, 1 + 2, 0),           # MLA keeps fused_add_rms_norm: dense gate_up only
                  "llama-1b": (2, 2, 2)}
TRACKED = (*COMPOSITES, "add_rms_norm_qkv_rotary")


@pytest.mark.parametrize("alias", list(EXPECTED_CALLS))
def test_decoder_calls_each_composite_per_step_at_the_listed_shapes(models, alias):
    model = models[alias]
    wl = make_workload(model, DECODE, seed=1)
    base = model.step(wl)
    tree = profiler.call_tree(model, wl)
    got = tuple(tree.get(n, {}).get("calls", 0) for n in TRACKED)
    assert got == EXPECTED_CALLS[alias]
    assert "silu_and_mul" not in tree                      # only ever inside silu_mul_linear now
    if got[0]:
        assert tree["add_rms_norm_linear"]["parts"] == {"fused_add_rms_norm": got[0], "linear": got[0]}
    if got[2]:                                             # rotary only ever inside the qkv composite then
        assert tree["add_rms_norm_qkv_rotary"]["parts"] == {"add_rms_norm_linear": got[2], "rotary_embedding": got[2]}
        assert "rotary_embedding" not in tree
    # every shape a composite sees is one its OpDef lists for this model and point, and vice versa
    # (the qkv composite runs its default, so the add_rms_norm_linear inside it is recorded too)
    seen = collections.defaultdict(list)

    def recording(name):
        ref = registry.get(name).default if name == "add_rms_norm_qkv_rotary" else _ref(name)

        def run(*args):
            if name == "add_rms_norm_linear":
                x, w, b = args[0], args[4], args[5]
                s = {"T": x.shape[0], "H": x.shape[1], "N": w.shape[0], "bias": b is not None}
            elif name == "add_rms_norm_qkv_rotary":
                x, w, b, r, hq, hk = args[0], args[4], args[5], args[8], args[9], args[10]
                s = {"T": x.shape[0], "H": x.shape[1], "Hq": hq, "Hk": hk, "Dh": w.shape[0] // (hq + 2 * hk),
                     "R": r, "bias": b is not None}
            else:
                s = {"T": args[0].shape[0], "I": args[0].shape[1] // 2, "N": args[1].shape[0]}
            if s not in seen[name]:
                seen[name].append(s)
            return ref(*args)
        return run
    with registry.override({n: recording(n) for n in TRACKED}):
        assert torch.equal(model.step(wl), base)
    for name in TRACKED:
        listed = registry.get(name).shapes(model.spec, DECODE)
        assert sorted(map(str, seen[name])) == sorted(map(str, listed)), name


def test_llama_1b_shapes_and_archs_without_call_sites():
    point = WorkloadPoint(phase="decode", batch=1, context=512, chunk=1, weight=1.0)
    llama = ModelSpec.from_name("llama-1b")
    assert registry.get("add_rms_norm_linear").shapes(llama, point) == [
        {"T": 1, "H": 2048, "N": 3072, "bias": False}, {"T": 1, "H": 2048, "N": 16384, "bias": False}]
    assert registry.get("silu_mul_linear").shapes(llama, point) == [{"T": 1, "I": 8192, "N": 2048}]
    qwen = ModelSpec.from_name("qwen3-moe")                 # all-MoE, no shared experts: qkv only
    assert [s["N"] for s in registry.get("add_rms_norm_linear").shapes(qwen, point)] == [
        (qwen.num_heads + 2 * qwen.num_kv_heads) * qwen.head_dim]
    assert registry.get("silu_mul_linear").shapes(qwen, point) == []
    assert registry.get("add_rms_norm_linear").shapes(ModelSpec.from_name("deepseek-v3"), point) == [
        {"T": 1, "H": 7168, "N": 2 * 18432, "bias": False}]             # MLA: dense gate_up only


def test_gqa_split_hands_strided_views_to_rotary(models):
    model = models["tiny-dense"]                             # no QK-norm: q and k reach rotary as views
    spec = model.spec
    wl = make_workload(model, DECODE, seed=2)
    base = model.step(wl)
    seen = []

    def rotary(pos, q, k, cache, r):
        seen.append((q.is_contiguous(), k.is_contiguous(), q.stride(0), k.stride(0)))
        return _ref("rotary_embedding")(pos, q.contiguous(), k.contiguous(), cache, r)
    with registry.override({"rotary_embedding": rotary}):
        assert torch.equal(model.step(wl), base)             # the reference gives the same on strided views
    row = (spec.num_heads + 2 * spec.num_kv_heads) * spec.head_dim
    assert seen == [(False, False, row, row)] * spec.num_layers


# ----------------------------------------------------------------------------- profiler attribution
def test_profile_attributes_time_to_the_outermost_op_with_parts(models):
    model = models["tiny-dense"]
    wl = make_workload(model, DECODE, seed=3)
    prof = profiler.profile_point(model, wl, torch.device("cpu"), reps=1)
    assert "silu_and_mul" not in prof
    assert prof["linear"]["calls"] == 2                               # o projections only
    assert set(prof["add_rms_norm_linear"]["parts"]) == {"fused_add_rms_norm", "linear"}
    assert set(prof["silu_mul_linear"]["parts"]) == {"silu_and_mul", "linear"}
    assert all(v > 0 for n in COMPOSITES for v in prof[n]["parts"].values())
    assert "parts" not in prof["linear"] and abs(sum(o["share"] for o in prof.values()) - 1) < 1e-9
    assert set(prof["add_rms_norm_qkv_rotary"]["parts"]) == {"add_rms_norm_linear", "rotary_embedding"}
    assert prof["add_rms_norm_linear"]["calls"] == 2 and "rotary_embedding" not in prof      # gate_up only
    # the regions looked through are named by the ops that ran inside them (what overriding one would replace)
    step, layer, kvw = "dense_gqa_decode_step", "dense_gqa_decode_layer", "add_rms_norm_qkv_rotary_kv_write"
    assert prof["add_rms_norm_qkv_rotary"]["regions"] == sorted([kvw, layer, step])
    assert prof["attention_decode"]["regions"] == sorted([layer, step]) and prof["lm_head"]["regions"] == [step]
    # at any depth: the linear and norm inside add_rms_norm_linear inside add_rms_norm_qkv_rotary count too
    assert profiler.op_calls(model, wl) == {
        "embedding": 1, "add_rms_norm_qkv_rotary": 2, "add_rms_norm_linear": 4, "fused_add_rms_norm": 4 + 1,
        "linear": 2 + 4 + 2, "rotary_embedding": 2, "attention_decode": 2, "silu_mul_linear": 2, "silu_and_mul": 2,
        "lm_head": 1,
        # the regions the decode step runs (ops/layers.py), looked through by the profile but counted here
        "dense_gqa_decode_step": 1, "dense_gqa_decode_layer": 2, "add_rms_norm_qkv_rotary_kv_write": 2}


def test_profile_runs_the_current_implementations(models):
    model = models["tiny-dense"]
    wl = make_workload(model, DECODE, seed=3)
    ran = collections.Counter()

    def counted(name):
        def run(*args):
            ran[name] += 1
            return _ref(name)(*args)
        return run
    # a fused override of the composite: no parts, and the fine ops inside it never run
    with registry.override({"silu_mul_linear": counted("silu_mul_linear"), "silu_and_mul": counted("silu_and_mul")}):
        prof = profiler.profile_point(model, wl, torch.device("cpu"), reps=2)
        tree = profiler.call_tree(model, wl)
    assert ran == {"silu_mul_linear": 3 * 2 + 2}                      # 3 profiled steps + call_tree, 2 layers
    assert prof["silu_mul_linear"]["parts"] == {} and prof["silu_mul_linear"]["calls"] == 2
    assert "parts" not in tree["silu_mul_linear"]
    # a fine-op override is profiled where it runs: inside the composite
    ran.clear()
    with registry.override({"silu_and_mul": counted("silu_and_mul")}):
        prof = profiler.profile_point(model, wl, torch.device("cpu"), reps=1)
    assert ran == {"silu_and_mul": 2 * 2} and "silu_and_mul" in prof["silu_mul_linear"]["parts"]
