"""MiniMax-M3: block selection and block-sparse attention against per-token loops, the layer against dense
attention under the selection mask, topk_blocks honoured, swigluoai against gpt-oss's formula."""

import pytest
import torch

from persistent_engine.models import build_model
from persistent_engine.models.spec import ModelSpec
from persistent_engine.ops import registry
from persistent_engine.ops.attention import attention_decode
from persistent_engine.ops.msa import block_sparse_decode, block_sparse_prefill, block_topk, swigluoai_and_mul
from persistent_engine.inputs.workloads import make_workload
from persistent_engine.io_struct import WorkloadPoint

F32 = torch.float32


def _inputs(name, shape, seed=5):
    return registry.get(name).make_inputs(shape, F32, "cpu", seed)


def _rows(cache, bt, b, n):
    bs = cache.shape[1]
    return torch.stack([cache[int(bt[b, j // bs]), j % bs] for j in range(n)])


def _seq_pos(cu, lens):
    out = []
    for b in range(len(lens)):
        n = int(cu[b + 1] - cu[b])
        out += [(b, int(lens[b]) - n + i) for i in range(n)]
    return out


@pytest.mark.parametrize("shape", [{"B": 3, "Hk": 2, "Di": 16, "ctx": 37, "BS": 16, "MB": 4, "topk": 3},
                                   {"B": 2, "chunk": 5, "Hk": 2, "Di": 8, "ctx": 23, "BS": 8, "MB": 4, "topk": 2,
                                    "init": 1}])
def test_block_topk_matches_a_per_token_loop(shape):
    q, kc, bt, cu, cl, mb, topk, init, local = _inputs("block_topk", shape)
    got = block_topk(q, kc, bt, cu, cl, mb, topk, init, local)
    for t, (b, p) in enumerate(_seq_pos(cu, cl)):
        keys = _rows(kc, bt, b, p + 1)
        own = p // mb
        for g in range(q.shape[1]):
            s = keys @ q[t, g]
            score = {blk: float(s[blk * mb: min(p + 1, blk * mb + mb)].max()) for blk in range(own + 1)}
            for blk in score:
                if blk < init or blk > own - local:
                    score[blk] = float("inf")
            want = sorted(score, key=lambda blk: (-score[blk], blk))[:topk]
            assert sorted(int(x) for x in got[t, g] if x >= 0) == sorted(want)


def _loop_attention(q, kc, vc, bt, seq_pos, blocks, mb, scale):
    out = torch.empty_like(q)
    hq, hk = q.shape[1], kc.shape[2]
    for t, (b, p) in enumerate(seq_pos):
        for h in range(hq):
            g = h // (hq // hk)
            keep = [j for j in range(p + 1) if j // mb in {int(x) for x in blocks[t, g] if x >= 0}]
            k, v = _rows(kc, bt, b, p + 1)[keep, g], _rows(vc, bt, b, p + 1)[keep, g]
            out[t, h] = torch.softmax(k @ q[t, h] * scale, -1) @ v
    return out


def test_block_sparse_attention_matches_a_loop_over_the_selected_tokens():
    q, kc, vc, bt, cl, sel, mb, scale = _inputs("block_sparse_decode", {"B": 3, "Hq": 4, "Hk": 2, "Dh": 16, "ctx": 37,
                                                                        "BS": 16, "MB": 4, "topk": 3})
    seq_pos = [(b, int(cl[b]) - 1) for b in range(3)]
    torch.testing.assert_close(block_sparse_decode(q, kc, vc, bt, cl, sel, mb, scale),
                               _loop_attention(q, kc, vc, bt, seq_pos, sel, mb, scale), atol=1e-5, rtol=1e-5)
    q, kc, vc, bt, cu, cl, sel, mb, scale = _inputs("block_sparse_prefill", {"B": 2, "chunk": 5, "Hq": 4, "Hk": 2,
                                                                             "Dh": 16, "ctx": 21, "BS": 8, "MB": 4,
                                                                             "topk": 2})
    torch.testing.assert_close(block_sparse_prefill(q, kc, vc, bt, cu, cl, sel, mb, scale),
                               _loop_attention(q, kc, vc, bt, _seq_pos(cu, cl), sel, mb, scale), atol=1e-5, rtol=1e-5)


def _dense_masked_decode(q, kc, vc, bt, cl, blocks, mb, scale):
    """Dense decode attention over each sequence's whole cache, per KV head group, with -inf outside the
    selected blocks: the independent formulation of block_sparse_decode."""
    b, hq, dh = q.shape
    hk = kc.shape[2]
    out = torch.empty_like(q)
    length = bt.shape[1] * kc.shape[1]
    pos_blk = torch.arange(length) // mb
    for g in range(hk):
        sel = (blocks[:, g, :, None].long() == pos_blk[None, None, :]).any(1)         # [B, L]
        k = torch.where(sel[..., None], kc[bt.long()].reshape(b, length, hk, dh)[:, :, g], torch.zeros(()))
        heads = slice(g * (hq // hk), (g + 1) * (hq // hk))
        s = torch.einsum("bhd,bld->bhl", q[:, heads].float(), k.float()) * scale
        s = s.masked_fill(~sel[:, None, :] | (torch.arange(length)[None, None, :] >= cl[:, None, None]), float("-inf"))
        v = vc[bt.long()].reshape(b, length, hk, dh)[:, :, g]
        out[:, heads] = torch.einsum("bhl,bld->bhd", torch.softmax(s, -1), v.float()).to(q.dtype)
    return out


def test_m3_layer_equals_dense_attention_under_the_block_mask_and_topk_matters():
    spec = ModelSpec.from_name("minimax+tiny")
    assert spec.msa_layers == (False, True, True) and spec.covering_layers() == [0, 1]
    model = build_model(spec, dtype=F32)
    wl = make_workload(model, WorkloadPoint(phase="decode", batch=3, context=40))
    ref = model.step(wl)
    with registry.override({"block_sparse_decode": _dense_masked_decode}):
        torch.testing.assert_close(model.step(wl), ref, atol=2e-4, rtol=2e-4)
    wide = build_model(spec.replace(msa_topk_blocks=64), dtype=F32)
    wl2 = make_workload(wide, WorkloadPoint(phase="decode", batch=3, context=40))
    with registry.override({"block_sparse_decode": lambda q, kc, vc, bt, cl, blocks, mb, scale:
                            attention_decode(q, kc, vc, bt, cl, scale)}):
        dense = wide.step(wl2)                                 # every block selected == dense attention
    torch.testing.assert_close(wide.step(wl2), dense, atol=2e-4, rtol=2e-4)
    assert (wide.step(wl2) - ref).abs().max() > 1e-3          # 2 blocks of 4 tokens is not the whole context


def test_swigluoai_is_gpt_oss_on_gate_up_halves():
    x = torch.randn(7, 2 * 12, generator=torch.Generator().manual_seed(0)) * 5
    gate, up = x[:, :12].clamp(max=7.0), x[:, 12:].clamp(-7.0, 7.0)
    want = (up + 1) * gate * torch.sigmoid(1.702 * gate)
    torch.testing.assert_close(swigluoai_and_mul(x, 1.702, 7.0), want)


def test_m3_spec_fields():
    s = ModelSpec.from_name("minimax")
    assert (s.family, s.num_kv_heads, s.rotary_dim, s.qk_norm, s.mlp_act, s.gemma_norm) == \
        ("minimax_m3", 4, 64, "per_head", "swigluoai", True)
    assert s.layer_kinds()[:4] == ["dense"] * 3 + ["moe"] and s.intermediate_size == 12288
    assert (s.msa_block_size, s.msa_topk_blocks, s.msa_local_blocks) == (128, 16, 1) and not s.block_sparse(2)
    assert 420e9 < s.total_params() < 432e9                     # published: 428B total
    assert ModelSpec.from_name("minimax-m2.5").family == "minimax_m2"
