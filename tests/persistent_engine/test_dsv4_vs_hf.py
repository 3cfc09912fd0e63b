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
        biases = [b for n, b in module.named_buffers() if n.endswith("e_score_correction_bias")]   # not rope tables
        for p in list(module.parameters()) + biases:
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


def _attention_cfg():
    return _cfg(compress_ratios=None, layer_types=["sliding_attention", "compressed_sparse_attention",
                                                   "heavily_compressed_attention", "compressed_sparse_attention"],
                compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8})


def _hf_attention_inputs(cfg, s):
    h = torch.randn(1, s, 32, generator=torch.Generator().manual_seed(15))
    pos = torch.arange(s)[None]
    rope = hf.DeepseekV4RotaryEmbedding(cfg)
    pe = {k: rope(h, position_ids=pos, layer_type=k) for k in ("main", "compress")}
    i, j = torch.arange(s)[:, None], torch.arange(s)[None, :]
    mask = torch.zeros(s, s).masked_fill((j > i) | (j <= i - cfg.sliding_window), float("-inf"))[None, None]
    return h, pos, pe, mask


@pytest.mark.parametrize("layer", [0, 1, 2])
def test_compressed_attention_in_the_hf_attention_layer(layer):
    """HF's whole DeepseekV4Attention against its projections + rope around compressed_attention (paged cache)."""
    cfg, s, bs = _attention_cfg(), 19, 4
    m = _randomize(hf.DeepseekV4Attention(cfg, layer), seed=16).eval()
    h, pos, pe, mask = _hf_attention_inputs(cfg, s)
    want = m(h, pe, pos, mask)[0]
    cos, sin = pe[m.rope_layer_type]
    q_res = m.q_a_norm(m.q_a_proj(h))
    q = hf.apply_rotary_pos_emb(m.q_b_norm(m.q_b_proj(q_res).view(1, s, 4, 16).transpose(1, 2)), cos, sin)
    kv = hf.apply_rotary_pos_emb(m.kv_norm(m.kv_proj(h)).view(1, s, 1, 16).transpose(1, 2), cos, sin)[0, 0]   # [S, D]
    nb = (s + bs - 1) // bs
    cache = torch.zeros(nb * bs, 16)
    cache[:s] = kv
    tables, cu, lens = torch.arange(nb, dtype=torch.int32)[None], torch.tensor([0, s], dtype=torch.int32), \
        torch.tensor([s], dtype=torch.int32)
    ratio, entries, ids = 0, torch.zeros(1, 1, 16), None
    if m.compressor is not None:
        ratio = m.compressor.compress_rate
        entries = m.compressor(h, q_res, pos, None, layer)[0][0]                     # [1, NE, D]
        if hasattr(m.compressor, "indexer"):
            ids = m.compressor.indexer(h, q_res, pos, None, layer)[0]                # [S, k], -1 = none
    n_entries = torch.tensor([s // ratio if ratio else 0])
    o = compressed_attention(q[0].transpose(0, 1).contiguous(), cache.view(nb, bs, 16), tables, cu, lens, entries,
                             n_entries, ids, ratio, cfg.sliding_window, m.sinks, m.scaling)        # [S, Hq, D]
    o = hf.apply_rotary_pos_emb(o[None].transpose(1, 2), cos, -sin).transpose(1, 2)
    mine = m.o_b_proj(m.o_a_proj(o.reshape(1, s, 2, -1)).flatten(2))
    _close(mine, want, 1e-4)


def test_csa_indexer_matches_hf_indexer():
    cfg, s = _attention_cfg(), 23
    comp = _randomize(hf.DeepseekV4CSACompressor(cfg), seed=17)
    idx = comp.indexer
    h, pos, _, _ = _hf_attention_inputs(cfg, s)
    q_res = torch.randn(1, s, 16, generator=torch.Generator().manual_seed(18))
    want = idx(h, q_res, pos, None, 0)[0]                                            # [S, k]
    keys = kv_compress(h[0] @ idx.kv_proj.weight.t(), h[0] @ idx.gate_proj.weight.t(), idx.position_bias,
                       idx.kv_norm.weight, 4, True, cfg.rms_norm_eps)
    cos, sin = idx.rotary_emb(keys[None], position_ids=(torch.arange(keys.shape[0]) * 4)[None], layer_type="compress")
    keys = hf.apply_rotary_pos_emb(keys[None, None], cos, sin)[0, 0]
    cq, sq = idx.rotary_emb(h, position_ids=pos, layer_type="compress")
    q = hf.apply_rotary_pos_emb(idx.q_b_proj(q_res).view(1, s, 2, 8).transpose(1, 2), cq, sq).transpose(1, 2)[0]
    w = idx.scorer.weights_proj(h)[0] * idx.scorer.weights_scaling
    got = csa_indexer(q, w, keys[None], torch.tensor([keys.shape[0]]), torch.tensor([0, s], dtype=torch.int32),
                      torch.tensor([s], dtype=torch.int32), 4, cfg.index_topk)
    # equal up to ties (relu makes exact-zero scores common; topk breaks them as it likes, the op by index):
    # the picked entries' scores agree as multisets, and the -1s agree
    score = (torch.relu(torch.einsum("thd,ed->the", q, keys)) * 8 ** -0.5 * w[..., None]).sum(1)      # [S, NE]

    def picked_scores(sel):
        return torch.where(sel >= 0, score.gather(1, sel.clamp(min=0)), torch.full(sel.shape, float("nan")))
    torch.testing.assert_close(picked_scores(got).sort(-1).values, picked_scores(want).sort(-1).values, equal_nan=True)
    assert ((got < 0).sum(-1) == (want < 0).sum(-1)).all() and (got >= 0).any()


def test_the_reference_forward_matches_hf_deepseek_v4_end_to_end():
    """Every layer kind (window-only, CSA, HCA), hash and top-k MoE layers, YaRN on compressed layers."""
    from persistent_engine.models.deepseek_v4 import V4Config, forward
    kw = dict(vocab_size=64, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1,
              moe_intermediate_size=16, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, q_lora_rank=16,
              head_dim=16, qk_rope_head_dim=4, o_groups=2, o_lora_rank=8, hc_mult=4, hc_sinkhorn_iters=20,
              hc_eps=1e-6, num_hash_layers=1, swiglu_limit=1.0, scoring_func="sqrtsoftplus", routed_scaling_factor=1.5,
              # 8 index heads: no exact-zero indexer scores, so no ties for topk and the op to break differently
              index_n_heads=8, index_head_dim=8, index_topk=2, sliding_window=6, compress_ratios=[0, 4, 128, 4],
              rms_norm_eps=1e-6, rope_theta=10000.0, compress_rope_theta=160000.0, max_position_embeddings=1024,
              rope_scaling={"type": "yarn", "factor": 16, "original_max_position_embeddings": 64, "beta_fast": 32,
                            "beta_slow": 1})
    model = hf.DeepseekV4ForCausalLM(DeepseekV4Config(**kw)).eval()
    _randomize(model, seed=20)
    with torch.no_grad():
        for layer in model.model.layers:
            if hasattr(layer.mlp.gate, "tid2eid"):
                layer.mlp.gate.tid2eid.copy_(torch.rand(64, 8, generator=torch.Generator().manual_seed(21)).argsort(-1)[:, :2])
    s = 140                                                   # > 128: the HCA layer closes one window
    ids = torch.randint(0, 64, (1, s), generator=torch.Generator().manual_seed(22))
    with torch.no_grad():
        want = model(ids).logits[0]
    got = forward(V4Config.from_hf(kw), dict(model.state_dict()), ids[0])
    _close(got, want, 2e-4)
