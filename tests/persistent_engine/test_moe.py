"""MoE routing and experts against brute-force per-token formulations."""

import pytest
import torch
import torch.nn.functional as F

from persistent_engine.ops import registry
from persistent_engine.ops import moe as moe_ops
from persistent_engine.io_struct import WorkloadPoint

route, experts = registry.get("moe_route").reference, registry.get("moe_experts").reference


def _brute_route(logits, bias, k, scoring, n_group, topk_group, norm, scale):
    rows = []
    for t in range(logits.shape[0]):
        s = {"softmax": lambda v: v.softmax(-1), "sigmoid": torch.sigmoid,
             "sqrtsoftplus": lambda v: torch.log1p(torch.exp(v)).sqrt()}[scoring](logits[t])
        c = s + (bias if bias is not None else 0)
        per = logits.shape[1] // n_group
        if n_group > 1:
            gs = [(sorted(c[g * per:(g + 1) * per].tolist())[-2:]) for g in range(n_group)]
            gs = [sum(v) if bias is not None else v[-1] for v in gs]
            groups = sorted(range(n_group), key=lambda g: -gs[g])[:topk_group]
            cand = [e for e in range(logits.shape[1]) if e // per in groups]
        else:
            cand = list(range(logits.shape[1]))
        chosen = sorted(sorted(cand, key=lambda e: -float(c[e]))[:k])
        w = s[chosen]
        rows.append((w / w.sum() if norm else w) * scale)
        rows[-1] = (rows[-1], chosen)
    return rows


@pytest.mark.parametrize("shape", registry.get("moe_route").examples)
def test_route_matches_brute_force(shape):
    args = registry.get("moe_route").make_inputs(shape, torch.float32, "cpu", 3)
    w, ids = route(*args)
    assert w.dtype == torch.float32 and ids.dtype == torch.int64 and ids.shape == (shape["T"], shape["k"])
    for t, (bw, bids) in enumerate(_brute_route(*args)):
        order = ids[t].argsort()
        assert ids[t][order].tolist() == bids
        assert torch.allclose(w[t][order], bw, atol=1e-6)


def test_grouped_routing_only_picks_from_the_best_groups():
    logits = torch.full((1, 16), -5.0)
    logits[0, 0] = 5.0                      # group 0 has one strong expert, group 3 two good ones
    logits[0, 12:14] = 3.0
    logits[0, 4] = 4.0                      # group 1: one strong expert
    w, ids = route(logits, torch.zeros(16), 3, "sigmoid", 4, 1, True, 1.0)
    assert sorted(ids[0].tolist())[:2] == [12, 13]      # top-2 sum picks group 3 over groups 0 and 1
    assert set(ids[0].tolist()) <= set(range(12, 16))


def _naive_experts(x, w13, w2, tw, ti):
    out = torch.zeros_like(x)
    i = w13.shape[1] // 2
    for t in range(x.shape[0]):
        for j in range(ti.shape[1]):
            e = int(ti[t, j])
            h = w13[e] @ x[t]
            out[t] += tw[t, j] * (w2[e] @ (F.silu(h[:i]) * h[i:]))
    return out


@pytest.mark.parametrize("shape", registry.get("moe_experts").examples)
def test_every_expert_path_matches_the_per_token_loop(shape):
    """gather (3*T*k < E), dense (T < LOOP_MIN_TOKENS) and loop paths all compute the same thing."""
    args = registry.get("moe_experts").make_inputs(shape, torch.float64, "cpu", 4)
    out = experts(*args)
    sub = slice(0, 40)                                          # the loop path is slow in Python
    want = _naive_experts(args[0][sub], args[1], args[2], args[3][sub], args[4][sub])
    assert torch.allclose(out[sub], want, atol=1e-10)


def test_paths_are_selected_by_shape():
    e, k = 16, 2
    assert 3 * 1 * k < e                                         # batch 1 gathers
    assert not 3 * 6 * k < e and 6 < moe_ops.LOOP_MIN_TOKENS      # dense


@pytest.mark.gpu
@pytest.mark.parametrize("alias", ["glm-4.6", "minimax-m2.5", "deepseek-v3", "kimi-k2", "glm", "deepseek-v3.2"])
def test_real_size_moe_layer_runs_on_gpu(alias):
    """One real-size MoE layer (7-34 GB of experts) with embeddings and lm_head, decode and prefill."""
    from persistent_engine.models.decoder import build_model
    from persistent_engine.models.spec import ModelSpec
    from persistent_engine.inputs.workloads import make_workload
    spec = ModelSpec.from_name(alias)
    moe_layer = spec.layer_kinds().index("moe")
    layers = sorted({moe_layer, spec.indexer_source(moe_layer) or moe_layer})    # a shared DSA layer + its source
    model = build_model(spec, layers=layers, device="cuda")
    assert model.params[f"layers.{moe_layer}.w13"].shape == (spec.num_experts, 2 * spec.moe_intermediate_size,
                                                              spec.hidden_size)
    for point in (WorkloadPoint(phase="decode", batch=1, context=1000), WorkloadPoint(phase="decode", batch=64, context=1000),
                  WorkloadPoint(phase="prefill", batch=1, context=0, chunk=1024)):
        logits = model.step(make_workload(model, point))
        assert logits.shape == (point.batch, spec.vocab_size) and torch.isfinite(logits).all()
    del model
    torch.cuda.empty_cache()


def test_sorted_path_adds_the_k_slots_in_a_fixed_order():
    """Above LOOP_MIN_TOKENS the rows come back in (token, slot) order and are summed over the k slots:
    no atomic accumulation (index_add_ on CUDA adds in a run-dependent order, so the bf16 result, and the
    routing of every later MoE layer, changed between two runs of the same prefill on the H200)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            accumulate = func.overloadpacket.__name__.startswith("index_put") and (
                kwargs.get("accumulate") or (len(args) > 3 and args[3]))
            self.ops.append((func.overloadpacket.__name__, bool(accumulate)))
            return func(*args, **kwargs)

    g = torch.Generator().manual_seed(0)
    t, e, k, h, i = moe_ops.LOOP_MIN_TOKENS + 5, 8, 3, 16, 8
    x = torch.randn(t, h, generator=g)
    w13, w2 = torch.randn(e, 2 * i, h, generator=g) * 0.3, torch.randn(e, h, i, generator=g) * 0.3
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    w = torch.rand(t, k, generator=g)
    with Seen() as seen:
        out = experts(x, w13, w2, w, ids)
    names = {n for n, _ in seen.ops}
    assert not names & {"index_add", "index_add_", "scatter_add", "scatter_add_", "index_reduce"}, names
    assert not any(acc for _, acc in seen.ops)
    # the same answer as a per-(token, slot) loop in float64
    want = torch.zeros(t, h, dtype=torch.float64)
    for tok in range(t):
        for j in range(k):
            a = F.linear(x[tok].double(), w13[ids[tok, j]].double())
            want[tok] += w[tok, j].double() * F.linear(F.silu(a[:i]) * a[i:], w2[ids[tok, j]].double())
    torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-4)


def test_op_level_checks_of_huge_expert_sets_use_fewer_experts(monkeypatch):
    """DeepSeek's moe_experts at full size needs ~360 GB for one op-level check: with a budget the check
    runs at fewer experts (same H, I, k, T); qwen3-moe's fits and keeps all 128; without a budget (CPU)
    nothing changes."""
    from persistent_engine.verification import verify
    from persistent_engine.models.spec import ModelSpec
    from persistent_engine.ops import contract

    d = registry.get("moe_experts")
    ds, qw = ModelSpec.from_name("deepseek-v3"), ModelSpec.from_name("qwen3-moe")
    point = WorkloadPoint(phase="decode", batch=13, context=1543, chunk=1, weight=1.0)
    (full,) = d.shapes(ds, point)
    fitted = d.fit(full, 150 * 10 ** 9 // 4)
    assert full["E"] == 256 and 16 <= fitted["E"] < 32
    assert {k: v for k, v in fitted.items() if k != "E"} == {k: v for k, v in full.items() if k != "E"}
    assert d.fit(full, 10 ** 6)["E"] == 2 * full["k"]                      # never fewer than 2k experts
    (q,) = d.shapes(qw, point)
    assert d.fit(q, 150 * 10 ** 9 // 4) == q                               # fits: unchanged

    seen = []
    monkeypatch.setattr(contract, "check_op", lambda name, impl, **kw: seen.append(kw["shapes"]) or [])
    checks = verify.op_level(["moe_experts"], {"moe_experts": experts}, ds, [point], torch.device("cpu"),
                             torch.bfloat16, 0, budget=150 * 10 ** 9 // 4)
    assert checks[0].passed and seen and all(s["E"] == fitted["E"] for s in seen[0][:1])
    seen.clear()
    verify.op_level(["moe_experts"], {"moe_experts": experts}, ds, [point], torch.device("cpu"), torch.bfloat16, 0)
    assert seen[0][0] == full
