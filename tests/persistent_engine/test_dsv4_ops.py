"""DeepSeek-V4 ops against independent formulations: per-token / per-window loops, block-diagonal matrices."""

import math

import pytest
import torch

from persistent_engine.ops import registry
from persistent_engine.ops.dsv4 import grouped_linear, kv_compress, moe_route_hash, swiglu_clamp_and_mul
from persistent_engine.ops.moe import moe_route


def _inputs(name, shape, seed=0):
    return registry.get(name).make_inputs(shape, torch.float32, "cpu", seed)


def test_swiglu_clamp_matches_elementwise_formula_and_the_limit_matters():
    x, limit = _inputs("swiglu_clamp_and_mul", {"T": 4, "I": 6, "limit": 2.0})
    gate, up = x[:, :6], x[:, 6:]
    g = torch.where(gate > limit, torch.full_like(gate, limit), gate)
    u = torch.maximum(torch.minimum(up, torch.full_like(up, limit)), torch.full_like(up, -limit))
    torch.testing.assert_close(swiglu_clamp_and_mul(x, limit), g / (1 + torch.exp(-g)) * u)
    assert not torch.allclose(swiglu_clamp_and_mul(x, limit), swiglu_clamp_and_mul(x, 1e9))


def test_hash_route_takes_the_table_and_weighs_by_sqrtsoftplus():
    logits, table, ids, scoring, norm, scale = _inputs("moe_route_hash", {"T": 5, "E": 16, "k": 4, "V": 20})
    w, got = moe_route_hash(logits, table, ids, scoring, norm, scale)
    for t in range(5):
        assert got[t].tolist() == table[ids[t]].tolist()
        s = [math.sqrt(math.log1p(math.exp(logits[t, e].item()))) for e in got[t].tolist()]
        torch.testing.assert_close(w[t], torch.tensor([v / sum(s) * scale for v in s]), rtol=1e-5, atol=1e-6)


def test_sqrtsoftplus_routing_picks_top_biased_scores():
    logits = torch.randn(6, 12, generator=torch.Generator().manual_seed(1))
    bias = torch.linspace(-1, 1, 12)
    w, ids = moe_route(logits, bias, 3, "sqrtsoftplus", 1, 1, True, 1.5)
    scores = torch.sqrt(torch.nn.functional.softplus(logits))
    assert (ids.sort(-1).values == (scores + bias).topk(3).indices.sort(-1).values).all()
    torch.testing.assert_close(w.sum(-1), torch.full((6,), 1.5))


def test_grouped_linear_is_a_block_diagonal_linear():
    x, w = _inputs("grouped_linear", {"T": 3, "G": 4, "K": 6, "R": 5})
    full = torch.block_diag(*w.view(4, 5, 6))                                 # [G R, G K]
    torch.testing.assert_close(grouped_linear(x, w).reshape(3, -1), x.reshape(3, -1) @ full.t(), rtol=1e-5, atol=1e-6)


def _loop_compress(kv, gate, bias, norm_w, r, overlap, eps):
    s, c = kv.shape
    d = c // 2 if overlap else c
    out = []
    for w in range(s // r):
        slots = []                                   # (kv row, gate row) of each source slot of entry w
        if overlap and w > 0:
            slots += [(kv[j, :d], gate[j, :d] + bias[j - (w - 1) * r, :d]) for j in range((w - 1) * r, w * r)]
        lo = d if overlap else 0
        slots += [(kv[j, lo:], gate[j, lo:] + bias[j - w * r, lo:]) for j in range(w * r, (w + 1) * r)]
        vals = torch.stack([v for v, _ in slots])
        weights = torch.softmax(torch.stack([g for _, g in slots]), dim=0)
        e = (vals * weights).sum(0)
        out.append(e / torch.sqrt(e.square().mean() + eps) * norm_w)
    return torch.stack(out) if out else kv.new_zeros(0, d)


@pytest.mark.parametrize("shape", [{"S": 19, "D": 8, "r": 4, "overlap": True}, {"S": 37, "D": 8, "r": 8, "overlap": False},
                                   {"S": 3, "D": 8, "r": 4, "overlap": True}])
def test_kv_compress_matches_per_window_loop(shape):
    args = _inputs("kv_compress", shape)
    torch.testing.assert_close(kv_compress(*args), _loop_compress(*args), rtol=1e-5, atol=1e-5)


def test_kv_compress_of_equal_rows_is_the_normed_row():
    row = torch.randn(1, 8, generator=torch.Generator().manual_seed(2))
    kv, gate = row.expand(12, 8), torch.randn(12, 8, generator=torch.Generator().manual_seed(3))
    out = kv_compress(kv, gate, torch.zeros(4, 8), torch.ones(8), 4, False, 1e-6)
    want = row / row.square().mean().add(1e-6).sqrt()
    torch.testing.assert_close(out, want.expand(3, 8), rtol=1e-5, atol=1e-5)


def test_clamped_experts_match_a_per_token_loop_and_differ_from_plain_swiglu():
    from persistent_engine.ops.dsv4 import moe_experts_clamp
    from persistent_engine.ops.moe import moe_experts
    x, w13, w2, tw, ti, limit = _inputs("moe_experts_clamp", {"T": 4, "E": 8, "k": 2, "H": 16, "I": 8, "limit": 1.0})
    want = torch.zeros_like(x)
    for t in range(4):
        for j in range(2):
            e = int(ti[t, j])
            want[t] += tw[t, j] * (swiglu_clamp_and_mul(x[t] @ w13[e].t(), limit) @ w2[e].t())
    got = moe_experts_clamp(x, w13, w2, tw, ti, limit)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got, moe_experts(x, w13, w2, tw, ti), atol=1e-3)
