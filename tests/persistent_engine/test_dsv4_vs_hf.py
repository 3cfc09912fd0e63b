"""DeepSeek-V4 ops against Hugging Face transformers' own DeepSeek-V4 modules (modeling_deepseek_v4.py), the
public modeling code the references follow. Skipped where transformers (with deepseek_v4) is not installed."""

import pytest
import torch

hf = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")
from transformers import DeepseekV4Config  # noqa: E402

from persistent_engine.ops.csa import compressed_attention, csa_indexer  # noqa: E402
from persistent_engine.ops.dsv4 import grouped_linear, kv_compress, moe_experts_clamp, moe_route_hash  # noqa: E402
from persistent_engine.ops.hc import hc_head, hc_post, hc_pre  # noqa: E402
from persistent_engine.ops.moe import moe_route  # noqa: E402


def _cfg(**kw):
    base = dict(vocab_size=64, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1,
                moe_intermediate_size=16, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, q_lora_rank=16,
                head_dim=16, qk_rope_head_dim=4, o_groups=2, o_lora_rank=8, hc_mult=4, hc_sinkhorn_iters=20,
                hc_eps=1e-6, num_hash_layers=1, swiglu_limit=1.0, scoring_func="sqrtsoftplus",
                routed_scaling_factor=1.5, index_n_heads=2, index_head_dim=8, index_topk=3, sliding_window=6,
                compress_ratios=[0, 4, 128, 4], rms_norm_eps=1e-6)
    base.update(kw)
    return DeepseekV4Config(**base)


def _randomize(module, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in list(module.parameters()) + [b for b in module.buffers() if b.is_floating_point()]:
            p.copy_(torch.randn(p.shape, generator=g) * (p.shape[-1] ** -0.5 if p.dim() > 1 else 0.5))
    return module


def _close(a, b, tol=1e-5):
    torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol)


def test_hyper_connection_and_mixing_match_hf():
    cfg = _cfg()
    m = _randomize(hf.DeepseekV4HyperConnection(cfg))
    x = torch.randn(1, 5, 4, 32, generator=torch.Generator().manual_seed(1))
    post, comb, collapsed = m(x)
    mine = hc_pre(x[0], m.fn, m.scale, m.base, cfg.hc_sinkhorn_iters, cfg.hc_eps, cfg.rms_norm_eps)
    for got, want in zip(mine, (collapsed[0], post[0], comb[0])):
        _close(got, want)
    out = torch.randn(1, 5, 32, generator=torch.Generator().manual_seed(2))
    hf_mixed = post.unsqueeze(-1) * out.unsqueeze(-2) + torch.matmul(comb.transpose(-1, -2), x)   # DecoderLayer.forward
    _close(hc_post(out[0], x[0], mine[1], mine[2]), hf_mixed[0])


def test_hyper_head_matches_hf():
    cfg = _cfg()
    m = _randomize(hf.DeepseekV4HyperHead(cfg))
    x = torch.randn(1, 3, 4, 32, generator=torch.Generator().manual_seed(3))
    _close(hc_head(x[0], m.hc_fn, m.hc_scale, m.hc_base, cfg.hc_eps, cfg.rms_norm_eps), m(x)[0])


@pytest.mark.parametrize("kind", ["heavily_compressed_attention", "compressed_sparse_attention"])
def test_kv_compress_matches_hf_compressors(kind):
    cfg = _cfg()
    cls = hf.COMPRESSOR_CLASSES[kind]
    m = _randomize(cls(cfg), seed=4)
    r, overlap = cfg.compress_rates[kind], kind == "compressed_sparse_attention"
    s = 2 * r + 3 if overlap else r + 5
    h = torch.randn(1, s, 32, generator=torch.Generator().manual_seed(5))
    q_res = torch.randn(1, s, 16, generator=torch.Generator().manual_seed(6))
    want = m(h, q_res, torch.arange(s)[None], None, 0)[0][0, 0]                    # [n, D], rotated
    mine = kv_compress(h[0] @ m.kv_proj.weight.t(), h[0] @ m.gate_proj.weight.t(), m.position_bias, m.kv_norm.weight,
                       r, overlap, cfg.rms_norm_eps)
    pos = (torch.arange(mine.shape[0]) * r)[None]
    cos, sin = m.rotary_emb(mine[None], position_ids=pos, layer_type="compress")
    _close(hf.apply_rotary_pos_emb(mine[None, None], cos, sin)[0, 0], want)


def test_routers_and_experts_match_hf():
    cfg = _cfg()
    x = torch.randn(6, 32, generator=torch.Generator().manual_seed(7))
    topk = _randomize(hf.DeepseekV4TopKRouter(cfg), seed=8)
    _, w, ids = topk(x)
    mw, mids = moe_route(x @ topk.weight.t(), topk.e_score_correction_bias, 2, "sqrtsoftplus", 1, 1, True, 1.5)
    assert (mids.sort(-1).values == ids.sort(-1).values).all()
    _close(mw.gather(1, mids.argsort(-1)), w.gather(1, ids.argsort(-1)))
    hashr = _randomize(hf.DeepseekV4HashRouter(cfg), seed=9)
    hashr.tid2eid.copy_(torch.rand(64, 8, generator=torch.Generator().manual_seed(10)).argsort(-1)[:, :2])
    tok = torch.randint(0, 64, (6,), generator=torch.Generator().manual_seed(11))
    _, w, ids = hashr(x, tok)
    mw, mids = moe_route_hash(x @ hashr.weight.t(), hashr.tid2eid, tok, "sqrtsoftplus", True, 1.5)
    assert (mids == ids).all()
    _close(mw, w)
    experts = _randomize(hf.DeepseekV4Experts(cfg), seed=12)
    x3 = x * 3                                                                       # so swiglu_limit 1.0 clamps
    _close(moe_experts_clamp(x3, experts.gate_up_proj, experts.down_proj, mw, mids, cfg.swiglu_limit),
           experts(x3, mids, mw))


def test_grouped_linear_matches_hf():
    m = _randomize(hf.DeepseekV4GroupedLinear(24, 2 * 8, 2), seed=13)
    x = torch.randn(5, 2, 24, generator=torch.Generator().manual_seed(14))
    _close(grouped_linear(x, m.weight), m(x[None])[0])
