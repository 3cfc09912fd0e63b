"""DeepSeek sparse attention (GLM-5.x, DeepSeek-V3.2): the indexer and the sparse MLA ops against
independent formulations, the layer against dense attention under the indexer's mask, and that
index_topk and the shared-indexer layers are honoured."""

import pytest
import torch

from persistent_engine.models import build_model
from persistent_engine.models.spec import ModelSpec, SpecError
from persistent_engine.ops import registry
from persistent_engine.ops.dsa import indexer_topk, sparse_mla_decode, sparse_mla_prefill
from persistent_engine.inputs.workloads import make_workload
from persistent_engine.io_struct import WorkloadPoint

F32 = torch.float32


def _inputs(name, shape, seed=3):
    return registry.get(name).make_inputs(shape, F32, "cpu", seed)


def _token_rows(cache, block_tables, b, n):
    """Sequence b's first n cached rows, read block by block (plain Python paging)."""
    bs = cache.shape[1]
    return torch.stack([cache[int(block_tables[b, j // bs]), j % bs] for j in range(n)])


def _seq_and_pos(cu, lens, t):
    out = []
    for b in range(len(lens)):
        n = int(cu[b + 1] - cu[b])
        out += [(b, int(lens[b]) - n + i) for i in range(n)]
    return out[:t]


@pytest.mark.parametrize("shape", [{"B": 3, "Hi": 4, "Di": 16, "ctx": 37, "BS": 16, "topk": 8},
                                   {"B": 2, "chunk": 5, "Hi": 3, "Di": 24, "ctx": 21, "BS": 8, "topk": 6}])
def test_indexer_matches_a_per_token_loop(shape):
    q, w, kc, bt, cu, cl, topk = _inputs("indexer_topk", shape)
    got = indexer_topk(q, w, kc, bt, cu, cl, topk)
    for t, (b, p) in enumerate(_seq_and_pos(cu, cl, q.shape[0])):
        keys = _token_rows(kc, bt, b, p + 1)                                  # [p + 1, Di]
        score = sum(w[t, h] * torch.relu(keys @ q[t, h]) for h in range(q.shape[1]))
        want = sorted(range(p + 1), key=lambda j: (-float(score[j]), j))[:topk]
        row = [int(x) for x in got[t] if x >= 0]
        assert sorted(row) == sorted(want)
        assert (got[t] < 0).sum() == topk - min(topk, p + 1)


def _dense_masked(q_nope, q_pe, cache, bt, seq_pos, sel, scale):
    """Dense MLA over every visible cached token, with the non-selected ones masked out."""
    out = []
    lat = q_nope.shape[-1]
    for t, (b, p) in enumerate(seq_pos):
        rows = _token_rows(cache, bt, b, p + 1)                               # [p + 1, L + R]
        s = (torch.cat([q_nope[t], q_pe[t]], -1) @ rows.T) * scale            # [H, p + 1]
        keep = torch.zeros(p + 1, dtype=torch.bool)
        keep[[int(j) for j in sel[t] if j >= 0]] = True
        out.append(torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ rows[:, :lat])
    return torch.stack(out)


def test_sparse_mla_equals_dense_attention_under_the_selection_mask():
    qn, qp, cache, bt, sel, scale = _inputs("sparse_mla_decode", {"B": 3, "H": 4, "L": 32, "R": 8, "ctx": 37,
                                                                 "BS": 16, "topk": 8})
    seq_pos = [(b, int(sel[b].max())) for b in range(3)]                         # own position is selected
    torch.testing.assert_close(sparse_mla_decode(qn, qp, cache, bt, sel, scale),
                               _dense_masked(qn, qp, cache, bt, seq_pos, sel, scale), atol=1e-5, rtol=1e-5)
    qn, qp, cache, bt, cu, sel, scale = _inputs("sparse_mla_prefill", {"B": 2, "chunk": 4, "H": 4, "L": 32, "R": 8,
                                                                      "ctx": 19, "BS": 8, "topk": 6})
    seq_pos = [(t // 4, int(sel[t].max())) for t in range(8)]
    torch.testing.assert_close(sparse_mla_prefill(qn, qp, cache, bt, cu, sel, scale),
                               _dense_masked(qn, qp, cache, bt, seq_pos, sel, scale), atol=1e-5, rtol=1e-5)


def _dense_with_mask_override():
    """sparse_mla_* re-expressed as dense mla attention (mla_decode / mla_prefill's formula over every
    position) with -inf outside the selection: the independent formulation of the layer."""
    def run(q_nope, q_pe, cache, bt, seq, sel, scale):
        lat, bs = q_nope.shape[-1], cache.shape[1]
        length = bt.shape[1] * bs
        rows = cache[bt.long()].reshape(bt.shape[0], length, -1)[seq]          # [T, Lp, L + R] whole sequences
        s = torch.einsum("thd,tld->thl", torch.cat([q_nope, q_pe], -1).float(), rows.float()) * scale
        keep = torch.zeros(s.shape[0], length + 1, dtype=torch.bool)          # column `length`: no token
        keep.scatter_(1, torch.where(sel >= 0, sel, length).long(), True)
        keep = keep[:, :length]
        p = torch.softmax(s.masked_fill(~keep[:, None, :], float("-inf")), -1)
        return torch.einsum("thl,tld->thd", p, rows[..., :lat].float()).to(q_nope.dtype)

    def decode(q_nope, q_pe, cache, bt, sel, scale):
        return run(q_nope, q_pe, cache, bt, torch.arange(q_nope.shape[0]), sel, scale)

    def prefill(q_nope, q_pe, cache, bt, cu, sel, scale):
        seq = torch.searchsorted(cu[1:].long(), torch.arange(q_nope.shape[0]), right=True)
        return run(q_nope, q_pe, cache, bt, seq, sel, scale)
    return {"sparse_mla_decode": decode, "sparse_mla_prefill": prefill}


@pytest.mark.parametrize("name", ["glm+tiny", "deepseek-v3.2+tiny"])
@pytest.mark.parametrize("point", [WorkloadPoint(phase="decode", batch=3, context=40),
                                   WorkloadPoint(phase="prefill", batch=2, context=2, chunk=9)])
def test_model_equals_dense_attention_with_the_indexer_mask(name, point):
    model = build_model(name, dtype=F32)
    wl = make_workload(model, point)
    ref = model.step(wl)
    with registry.override(_dense_with_mask_override()):
        dense = model.step(wl)
    torch.testing.assert_close(ref, dense, atol=2e-4, rtol=2e-4)


def test_index_topk_changes_the_output_and_all_tokens_is_dense_mla():
    spec = ModelSpec.from_name("deepseek-v3.2+tiny")
    point = WorkloadPoint(phase="decode", batch=2, context=40)

    def logits(s):
        m = build_model(s, dtype=F32, seed=5)
        return m.step(make_workload(m, point, seed=1, fill="model"))     # the cache from the model itself
    sparse, wide = logits(spec), logits(spec.replace(index_topk=4096))
    dense = logits(spec.replace(index_topk=0, index_n_heads=0, index_head_dim=0))   # plain MLA, same weights
    assert (sparse - wide).abs().max() > 1e-3                 # top-8 of 41 tokens is not dense attention
    torch.testing.assert_close(wide, dense, atol=1e-4, rtol=1e-4)   # a top-k of every token is


def test_shared_layers_reuse_the_source_selection():
    spec = ModelSpec.from_name("glm+tiny")
    assert spec.indexer_types == ("full", "full", "shared") and spec.indexer_source(2) == 1
    model = build_model(spec, dtype=F32)
    wl = make_workload(model, WorkloadPoint(phase="decode", batch=2, context=30))
    calls = []

    def counting(*args):
        calls.append(1)
        return indexer_topk(*args)
    with registry.override({"indexer_topk": counting}):
        model.step(wl)
    assert len(calls) == 2                                    # layers 0 and 1; layer 2 runs no indexer
    assert "layers.2.idx_wq_b" not in model.params and "layers.1.idx_wq_b" in model.params
    with pytest.raises(SpecError, match="reuses layer 1"):
        build_model(spec, layers=[0, 2])


def test_glm52_schedule_and_covering_layers():
    spec = ModelSpec.from_name("glm")
    assert spec.family == "glm_moe_dsa" and spec.name == "glm"
    kinds = [spec.indexer_kind(i) for i in range(12)]
    assert kinds == ["full"] * 3 + ["shared"] * 3 + ["full"] + ["shared"] * 3 + ["full", "shared"]
    assert spec.covering_layers() == [0, 2, 3]               # dense + full, moe + shared, and 3's source 2
    assert ModelSpec.from_name("glm-5.1").indexer_types == ()      # every layer runs its indexer
    assert spec.kv_bytes_per_token_layer(layer=0) == (512 + 64 + 128) * 2
    assert spec.kv_bytes_per_token_layer(layer=3) == (512 + 64) * 2
