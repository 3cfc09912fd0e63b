"""The decoder against an independent formulation: the whole sequence at once in fp32, plain causal
attention over an unpaged cache, MLA decompressed (not absorbed), MoE routed token by token."""

import collections

import pytest
import torch
import torch.nn.functional as F

from persistent_engine.models.decoder import build_model
from persistent_engine.models.spec import ALIASES, ModelSpec, SpecError
from persistent_engine.ops import registry
from persistent_engine.inputs.workloads import make_workload
from persistent_engine.io_struct import WorkloadPoint


@pytest.fixture
def one_thread():
    """Real-size CPU runs: one intra-op thread (on a shared, busy machine 2 spinning threads are slower)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.float()


def _rope(x, cos, sin, r):
    """neox rotary as a complex product: pairs (j, j + r/2) rotate by angle pos * inv_freq[j]."""
    z = torch.complex(x[..., : r // 2], x[..., r // 2: r]) * torch.complex(cos, sin)[:, None, :]
    return torch.cat([z.real, z.imag, x[..., r:]], dim=-1)


def _naive_moe(spec, p, pre, h):
    out = torch.zeros_like(h)
    w13, w2 = p[pre + "w13"].float(), p[pre + "w2"].float()
    logits = (h.to(p[pre + "router_w"].dtype) @ p[pre + "router_w"].t()).float()
    bias = p.get(pre + "router_bias")
    for t in range(h.shape[0]):
        s = logits[t].softmax(-1) if spec.scoring == "softmax" else logits[t].sigmoid()
        choice = s if bias is None else s + bias
        allowed = torch.ones_like(s, dtype=torch.bool)
        if spec.n_group > 1:
            groups = choice.view(spec.n_group, -1)
            gscore = [sorted(g.tolist())[-2:] for g in groups]
            gscore = [sum(v) if bias is not None else v[-1] for v in gscore]
            best = sorted(range(spec.n_group), key=lambda i: -gscore[i])[: spec.topk_group]
            allowed = torch.tensor([i // (spec.num_experts // spec.n_group) in best for i in range(spec.num_experts)])
        ranked = [i for i in sorted(range(spec.num_experts), key=lambda i: -float(choice[i])) if allowed[i]]
        chosen = ranked[: spec.num_experts_per_tok]
        weights = torch.stack([s[i] for i in chosen])
        if spec.norm_topk_prob:
            weights = weights / weights.sum()
        for e, wgt in zip(chosen, weights * spec.routed_scaling_factor):
            gate, up = (w13[e] @ h[t]).chunk(2)
            out[t] += wgt * (w2[e] @ (F.silu(gate) * up))
    if pre + "shared_gate_up_w" in p:
        gate, up = (h @ p[pre + "shared_gate_up_w"].float().t()).chunk(2, -1)
        out += (F.silu(gate) * up) @ p[pre + "shared_down_w"].float().t()
    return out


def naive_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """Logits at every position of one sequence ``ids`` [N], fp32, no paging, no registry."""
    spec, p, eps = model.spec, model.params, model.spec.rms_norm_eps
    n = ids.shape[0]
    f = {k: v.float() for k, v in p.items()}
    cos, sin = model.cos_sin[:n].chunk(2, dim=-1)
    x = f["embed"][ids]
    for i in model.layers:
        pre = f"layers.{i}."
        h = _rms(x, f[pre + "input_norm"], eps)
        if spec.attention == "mla":
            if spec.q_lora_rank:
                q = _rms(h @ f[pre + "q_a_w"].t(), f[pre + "q_a_norm"], eps) @ f[pre + "q_b_w"].t()
            else:
                q = h @ f[pre + "q_w"].t()
            q = q.view(n, spec.num_heads, -1)
            kv = h @ f[pre + "kv_a_w"].t()
            c = _rms(kv[:, : spec.kv_lora_rank], f[pre + "kv_a_norm"], eps)
            r = spec.qk_rope_head_dim
            q_pe = _rope(q[..., spec.qk_nope_head_dim:], cos, sin, r)
            k_pe = _rope(kv[:, None, spec.kv_lora_rank:], cos, sin, r).expand(n, spec.num_heads, r)
            k_nope = torch.einsum("nl,hdl->nhd", c, f[pre + "w_uk"])
            v = torch.einsum("nl,hvl->nhv", c, f[pre + "w_uv"])
            qh, kh = torch.cat([q[..., : spec.qk_nope_head_dim], q_pe], -1), torch.cat([k_nope, k_pe], -1)
        else:
            hq, hk, dh = spec.num_heads, spec.num_kv_heads, spec.head_dim
            qkv = h @ f[pre + "qkv_w"].t() + (f[pre + "qkv_b"] if spec.qkv_bias else 0)
            q, k, v = qkv.split([hq * dh, hk * dh, hk * dh], -1)
            if spec.qk_norm == "per_layer":
                q, k = _rms(q, f[pre + "q_norm"], eps), _rms(k, f[pre + "k_norm"], eps)
            q, k, v = q.reshape(n, hq, dh), k.reshape(n, hk, dh), v.reshape(n, hk, dh)
            if spec.qk_norm == "per_head":
                q, k = _rms(q, f[pre + "q_norm"], eps), _rms(k, f[pre + "k_norm"], eps)
            r = spec.rotary_dim or dh
            qh, kh = _rope(q, cos, sin, r), _rope(k, cos, sin, r)
            kh, v = kh.repeat_interleave(hq // hk, dim=1), v.repeat_interleave(hq // hk, dim=1)
        o = F.scaled_dot_product_attention(qh.transpose(0, 1), kh.transpose(0, 1), v.transpose(0, 1),
                                           is_causal=True, scale=model.scale).transpose(0, 1)
        x = x + o.reshape(n, -1) @ f[pre + "o_w"].t()
        h = _rms(x, f[pre + "post_norm"], eps)
        if spec.layer_kind(i) == "dense":
            gate, up = (h @ f[pre + "gate_up_w"].t()).chunk(2, -1)
            x = x + (F.silu(gate) * up) @ f[pre + "down_w"].t()
        else:
            x = x + _naive_moe(spec, p, pre, h)
    return _rms(x, f["final_norm"], eps) @ f.get("lm_head", f["embed"]).t()


def _close(a, b, rel):
    err = (a - b).abs().max() / b.abs().max()
    assert err < rel, f"max error {float(err):.3g} of the largest logit (allowed {rel})"


def _decode_vs_naive(model, batch, context, rel, seed=0):
    wl = make_workload(model, WorkloadPoint(phase="decode", batch=batch, context=context), seed=seed, fill="model")
    logits = model.step(wl)
    # the cached context came from a prefill over seeded tokens: recover them by re-drawing
    pre = make_workload(model, WorkloadPoint(phase="prefill", batch=batch, context=0, chunk=context), seed + 1,
                        cache=model.alloc_cache(batch, context, fill="zeros"))
    ids = torch.cat([pre.token_ids.view(batch, context), wl.token_ids.view(batch, 1)], dim=1)
    for b in range(batch):
        _close(logits[b], naive_logits(model, ids[b])[-1], rel)
    return logits


@pytest.mark.parametrize("alias", ["tiny-dense", "tiny-moe", "tiny-mla"])
def test_tiny_decode_matches_independent_formulation(alias):
    _decode_vs_naive(build_model(alias, dtype=torch.float32), batch=3, context=21, rel=1e-4)
    _decode_vs_naive(build_model(alias, dtype=torch.bfloat16), batch=2, context=21, rel=0.05)


@pytest.mark.slow
def test_llama_1b_real_dims_matches_independent_formulation(one_thread):
    model = build_model("llama-1b", layers=[0, 15], dtype=torch.bfloat16)
    assert model.params["layers.0.qkv_w"].shape == (32 * 64 + 2 * 8 * 64, 2048)
    _decode_vs_naive(model, batch=1, context=40, rel=0.05)


@pytest.mark.parametrize("alias", ["tiny-dense", "tiny-moe", "tiny-mla"])
def test_prefill_then_decode_equals_longer_prefill(alias):
    model = build_model(alias, dtype=torch.float32)
    n = 19
    ids = torch.randint(0, model.spec.vocab_size, (2, n + 1), generator=torch.Generator().manual_seed(3))
    pre = make_workload(model, WorkloadPoint(phase="prefill", batch=2, context=0, chunk=n), fill="zeros",
                        token_ids=ids[:, :n], capacity=n + 1)
    model.step(pre)
    dec = make_workload(model, WorkloadPoint(phase="decode", batch=2, context=n), cache=pre.cache, token_ids=ids[:, n])
    full = make_workload(model, WorkloadPoint(phase="prefill", batch=2, context=0, chunk=n + 1), fill="zeros",
                         token_ids=ids)
    _close(model.step(dec), model.step(full), 1e-5)


def test_prefill_chunk_on_cached_prefix_equals_one_prefill():
    model = build_model("tiny-moe", dtype=torch.float32)
    ids = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(4))
    first = make_workload(model, WorkloadPoint(phase="prefill", batch=1, context=0, chunk=16), token_ids=ids[:, :16],
                          fill="zeros", capacity=24)
    model.step(first)
    second = make_workload(model, WorkloadPoint(phase="prefill", batch=1, context=16, chunk=8), cache=first.cache,
                           token_ids=ids[:, 16:])
    _close(model.step(second)[0], naive_logits(model, ids[0])[-1], 1e-4)


def test_step_is_rerunnable_and_deterministic():
    model = build_model("tiny-mla")
    wl = make_workload(model, WorkloadPoint(phase="decode", batch=4, context=30))
    a, b = model.step(wl), model.step(wl)
    assert a.shape == (4, 256) and a.dtype == torch.float32 and torch.equal(a, b)
    assert model.greedy(a).tolist() == a.argmax(-1).tolist()


def _counting(counts: collections.Counter):
    """An override factory: op name -> its reference, counting its calls in ``counts``."""
    def counting(name):
        ref = registry.get(name).reference

        def run(*args):
            counts[name] += 1
            return ref(*args)
        return run
    return counting


def test_counting_override_proves_every_op_goes_through_the_registry():
    counts = collections.Counter()
    counting = _counting(counts)
    model = build_model("tiny-moe")                      # layers: dense, moe, moe
    wl = make_workload(model, WorkloadPoint(phase="decode", batch=2, context=10))
    base = model.step(wl)
    with registry.override({n: counting(n) for n in registry.names()}):
        assert torch.equal(model.step(wl), base)
    assert counts["embedding"] == 1 and counts["lm_head"] == 1
    assert counts["attention_decode"] == 3 and counts["rotary_embedding"] == 3
    assert counts["moe_route"] == 2 and counts["moe_experts"] == 2
    # composites are counted once (their references do not go through the registry)
    assert counts["add_rms_norm_linear"] == 3 + 1          # norm+qkv per layer; dense post-norm+gate_up
    assert counts["silu_mul_linear"] == 1 + 2              # dense down; shared-expert down per moe
    assert counts["linear"] == 3 + 2 * 2                   # o per layer; router+shared gate_up per moe
    assert counts["rms_norm"] == 3 * 2                     # per-head q/k norms
    assert counts["fused_add_rms_norm"] == 2 + 1 and counts["silu_and_mul"] == 0    # moe post norms; final
    with registry.override({"silu_and_mul": lambda x: registry.get("silu_and_mul").reference(x) * 0}):
        assert not torch.equal(model.step(wl), base)     # the override is what runs (inside silu_mul_linear)


def test_llama_style_layers_call_the_fused_qkv_rotary_composite():
    """GQA without QK-norm: one add_rms_norm_qkv_rotary per layer replaces add_rms_norm_linear + rotary."""
    counts = collections.Counter()
    counting = _counting(counts)
    model = build_model("tiny-dense")                    # 2 dense GQA layers, no QK-norm
    wl = make_workload(model, WorkloadPoint(phase="decode", batch=2, context=10))
    base = model.step(wl)
    with registry.override({n: counting(n) for n in registry.names()}):
        assert torch.equal(model.step(wl), base)
    assert dict(counts) == {"dense_gqa_decode_step": 1}         # a Llama-style decode step is one region op
    counts.clear()
    regions = {"dense_gqa_decode_step", "dense_gqa_decode_layer", "add_rms_norm_qkv_rotary_kv_write"}
    with registry.override({n: counting(n) for n in registry.names() if n not in regions}):
        assert torch.equal(model.step(wl), base)               # the regions' defaults: the fine ops
    assert counts["add_rms_norm_qkv_rotary"] == 2 and counts["rotary_embedding"] == 0
    assert counts["add_rms_norm_linear"] == 2 and counts["silu_mul_linear"] == 2      # gate_up; down
    assert counts["linear"] == 2 and counts["fused_add_rms_norm"] == 1 and counts["rms_norm"] == 0


def test_slices_keep_layer_weights_and_cover_layer_kinds():
    spec = ModelSpec.from_name("tiny-mla")
    full = build_model(spec)
    fast = build_model(spec, layers=spec.covering_layers())
    assert fast.layers == [0, 1] and [b.kind for b in fast.blocks] == ["dense", "moe"]
    assert torch.equal(full.params["layers.1.w13"], fast.params["layers.1.w13"])
    assert build_model(spec, layers=2).layers == [0, 1]
    with pytest.raises(SpecError, match="bad layer selection"):
        build_model(spec, layers=[0, 7])


@pytest.mark.parametrize("alias", list(ALIASES))
def test_every_alias_at_tiny_scale_returns_finite_logits(alias):
    spec = ModelSpec.from_name(alias).scaled_down()
    assert spec.family == ModelSpec.from_name(alias).family and spec.hidden_size == 64
    model = build_model(spec)
    for point in (WorkloadPoint(phase="decode", batch=3, context=17), WorkloadPoint(phase="prefill", batch=2, context=5, chunk=6)):
        logits = model.step(make_workload(model, point, fill="model"))
        assert logits.shape == (point.batch, spec.vocab_size) and torch.isfinite(logits).all()


def test_bf16_activations_stay_finite_through_many_layers():
    spec = ModelSpec.from_name("glm-4.6").scaled_down().replace(num_layers=24)
    model = build_model(spec)
    logits = model.step(make_workload(model, WorkloadPoint(phase="decode", batch=2, context=40)))
    assert torch.isfinite(logits).all() and 0.1 < logits.std() < 30


@pytest.mark.slow
@pytest.mark.parametrize("alias,layers", [("llama-8b", [0]), ("qwen3-moe", [0])])
def test_real_dims_slice_runs_on_cpu(alias, layers, one_thread):
    model = build_model(alias, layers=layers)
    spec = model.spec
    assert model.params["embed"].shape == (spec.vocab_size, spec.hidden_size)
    logits = model.step(make_workload(model, WorkloadPoint(phase="decode", batch=2, context=33)))
    assert logits.shape == (2, spec.vocab_size) and torch.isfinite(logits).all()


@pytest.mark.gpu
@pytest.mark.parametrize("alias", ["tiny-dense", "tiny-moe", "tiny-mla"])
def test_decode_step_has_no_host_sync_and_replays_in_a_cuda_graph(alias):
    model = build_model(alias, device="cuda")
    for batch in (1, 64):                    # MoE: the gather path, then the dense path
        wl = make_workload(model, WorkloadPoint(phase="decode", batch=batch, context=100))
        eager = model.step(wl)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            model.step(wl)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            model.step(wl)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = model.step(wl)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)
