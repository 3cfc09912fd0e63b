"""Tie-aware layer-level verification of the sparse-attention selections other than DeepSeek-V4's CSA: DSA's lightning
indexer (``indexer_topk``: DeepSeek-V3.2, GLM-5.x, whose "shared" layers attend with the last full layer's picks) and
MiniMax-M3's block selection (``block_topk``). Each test builds the tiny model, records the reference's step
(``verify.routed_step``), runs a candidate with the reference's decisions replayed and checks it (``TieCheck``), as
the judge's layer-level check does across its executors. Ties are made on purpose: the indexer keys' weights are
set so that every position (DSA) or every block (M3) scores the same up to an ulp, so a correct candidate that
rounds toward zero flips picks in most queries; a candidate that skews the indexer's queries is rejected by name."""

import pytest
import torch

from persistent_engine.verification import verify
from persistent_engine.io_struct import WorkloadPoint
from persistent_engine.judge import engine as eng
from persistent_engine.models.decoder import build_model
from persistent_engine.ops import dsa, registry
from persistent_engine.ops.basic import rms_norm
from persistent_engine.ops.contract import check_op
from persistent_engine.inputs.workloads import make_workload

# every position computed in the step (a random-filled context's indexer keys would not be tied): 24 tokens a
# sequence, so queries past index_topk = 8 positions (M3: past 2 blocks of 4) select
PREFILL = WorkloadPoint(phase="prefill", batch=2, context=0, chunk=24, weight=1.0)

# correct candidates that round differently: fp32 results rounded toward zero to bf16 (within one ulp of the
# reference's round-to-nearest); as a source for the judge's verification, as functions in process
TRUNC_SOURCE = '''import torch
import torch.nn.functional as F
def _trunc(y):
    return (y.float().contiguous().view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)
def layer_norm(x, weight, bias, eps):
    y = F.layer_norm(x.float(), (x.shape[-1],), weight.float(), bias.float(), eps)
    return _trunc(y) if x.dtype == torch.bfloat16 else y.to(x.dtype)
def rms_norm(x, weight, eps):
    y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return _trunc(y) if x.dtype == torch.bfloat16 else y.to(x.dtype)
OVERRIDES = {"OP": OP}
'''
_NS: dict = {}
exec(TRUNC_SOURCE.replace('"OP": OP', ''), _NS)
trunc_layer_norm, trunc_rms_norm = _NS["layer_norm"], _NS["rms_norm"]


def _skewed(fn, target: torch.Tensor):
    """``fn`` (a linear or rms_norm) with each output mixed 30% with its neighbour's where its weight is
    ``target`` (one indexer's query projection or norm): the indexer's scores move by O(their spread)."""
    def skew(x, w, *rest):
        out = fn(x, w, *rest)
        return out + 0.3 * out.roll(1, -1) if w.data_ptr() == target.data_ptr() else out
    return skew


def _check(model, w, overrides: dict, ref_logits, ref_calls):
    """(reason or None, the TieCheck, the candidate's recorder) of one candidate step with the reference's
    decisions replayed; the reference's cache rows are written back after."""
    out, cand = verify.routed_step(registry, model, w, overrides, ref_calls)
    ties = verify.TieCheck(torch.bfloat16, depths=verify.moe_depths(model), pick_depths=verify.pick_depths(model))
    reason = ties.compare(out, ref_logits, "p", ref_calls, cand.calls, w.cu_seqlens_q, key=(0, 0),
                          replayed=isinstance(cand, verify.RouteReplay))
    model.step(w)
    return reason, ties, cand


def _picks(calls: list, op: str) -> list:
    return [c for c in calls if isinstance(c, verify.PickCall) and c.op == op]


# ----------------------------------------------------------------------------- DSA
def tied_dsa(name: str):
    """``name``'s tiny model whose full layers' indexer keys are 1.0 in every non-rotary dim and 0 in the rotary
    ones at every position: k_norm's weight 2^-12 (its normalised input moves the key by < half an ulp of 1.0) and
    bias 1 there, 0 and 0 on the rotary dims. Every visible position then scores exactly the same, so each query
    past index_topk positions has its selection on an exact tie; a key rounded toward zero is 1 - 2^-8 where the
    normalised input is negative, which breaks the tie a different way at each position."""
    model = build_model(name, dtype=torch.bfloat16, seed=0)
    r = model.spec.qk_rope_head_dim
    for layer in model.blocks:
        if layer.attn.full:
            layer.attn.k_norm_w[:r], layer.attn.k_norm_w[r:] = 0.0, 2.0 ** -12
            layer.attn.k_norm_b[:r], layer.attn.k_norm_b[r:] = 0.0, 1.0
    return model


@pytest.mark.parametrize("name", ["glm+tiny", "deepseek-v3.2+tiny"])
def test_dsa_near_tie_flips_of_a_correct_candidate_are_replayed_and_accepted(name):
    assert check_op("layer_norm", trunc_layer_norm) == []          # correct by the op contract
    model = tied_dsa(name)
    w = make_workload(model, PREFILL, seed=3)
    ref, rec = verify.routed_step(registry, model, w, {}, None)
    full = [j for j, i in enumerate(model.layers) if model.spec.indexer_kind(i) == "full"]
    assert verify.pick_depths(model) == full and len(_picks(rec.calls, "indexer_topk")) == len(full)
    tied = _picks(rec.calls, "indexer_topk")[0]
    vis = tied.scores > float("-inf")
    assert bool((tied.scores == tied.scores.max(-1, keepdim=True).values)[vis].all())      # every position tied
    reason, ties, cand = _check(model, w, {"layer_norm": trunc_layer_norm}, ref, rec.calls)
    assert reason is None, reason
    flipped = sum(int((r.ids != c.ids).any(-1).sum()) for r, c in
                  zip(_picks(rec.calls, "indexer_topk"), _picks(cand.calls, "indexer_topk")))
    n, worst = ties.picks["indexer_topk"]
    assert n == flipped and flipped >= 10 and worst == 0.0, (flipped, ties.summary())
    assert "DSA indexer: " in ties.summary() and "picked other positions at near-ties" in ties.summary()
    assert not ties.kept_rows[(0, 0)].any()                        # every sequence out of bench's spot re-check only
    # free-running (nothing replayed), the same candidate attends other positions: its logits are far off
    free, _ = verify.routed_step(registry, model, w, {"layer_norm": trunc_layer_norm}, None)
    model.step(w)
    assert verify.compare_logits(free, ref, torch.bfloat16, "free") is not None


def test_glm_shared_layers_attend_with_the_replayed_picks_of_their_full_layer():
    model = tied_dsa("glm+tiny")
    spec = model.spec
    assert [spec.indexer_kind(i) for i in model.layers] == ["full", "full", "shared"]
    w = make_workload(model, PREFILL, seed=3)
    ref, rec = verify.routed_step(registry, model, w, {}, None)
    seen: list = []                                                # the selection each layer's attention reads

    def attend(q_nope, q_pe, cache, bt, cu, sel, scale):
        seen.append(sel.clone())
        return dsa.sparse_mla_prefill(q_nope, q_pe, cache, bt, cu, sel, scale)
    reason, ties, cand = _check(model, w, {"layer_norm": trunc_layer_norm, "sparse_mla_prefill": attend}, ref,
                                rec.calls)
    assert reason is None and len(seen) == 3, reason
    source_ref, source_cand = _picks(rec.calls, "indexer_topk")[1], _picks(cand.calls, "indexer_topk")[1]
    flipped = (source_ref.ids != source_cand.ids).any(-1)
    assert int(flipped.sum()) >= 5
    assert torch.equal(seen[2], seen[1])                           # the shared layer reads layer 1's picks...
    assert torch.equal(seen[2][flipped].long().sort(-1).values, source_ref.ids[flipped])    # ...the replayed ones
    assert not torch.equal(seen[2][flipped].long().sort(-1).values, source_cand.ids[flipped])


@pytest.mark.parametrize("name", ["glm+tiny", "deepseek-v3.2+tiny"])
def test_dsa_a_skewed_indexer_query_is_rejected_by_name(name):
    model = build_model(name, dtype=torch.bfloat16, seed=0)          # random weights: the scores spread
    w = make_workload(model, PREFILL, seed=3)
    ref, rec = verify.routed_step(registry, model, w, {}, None)
    wq = model.blocks[0].attn.wq_i
    reason, _, _ = _check(model, w, {"linear": _skewed(registry.current("linear"), wq)}, ref, rec.calls)
    assert reason is not None and "p: DSA indexer picks differ beyond ties: " in reason, reason
    band = 2 * verify.TIE_RTOL[torch.bfloat16]                      # the first layer's (d = 0)
    assert float(reason.split("worst margin ")[1].split()[0]) > 3 * band


# ----------------------------------------------------------------------------- MiniMax-M3
def tied_m3():
    """minimax+tiny whose block-sparse layers' index queries and keys are all (0 on the rotary dims, ~1 on the
    others) up to an ulp: the fused projection's index rows scaled by 2^-6 and given a bias of 1 (so each row is
    1 + a variation below or about an ulp of 1), index_q_norm's and index_k_norm's weights 0 on the rotary dims and
    1 on the rest. Every visible block then scores Di / 2 up to a few ulps, and the one free block per query
    (topk_blocks 2, its own forced) is chosen on a near-tie; the scores' unit stays their size (no query is
    orthogonal to the keys)."""
    model = build_model("minimax+tiny", dtype=torch.bfloat16, seed=0)
    for layer in model.blocks:
        if model.spec.block_sparse(layer.index):
            a = layer.attn
            n = (a.hq + 2 * a.hk) * a.dh                    # the index rows follow q | k | v
            bias = torch.zeros(a.qkv_w.shape[0], dtype=a.qkv_w.dtype)
            a.qkv_w[n:] *= 2.0 ** -6
            bias[n:] = 1.0
            layer.attn_in = (a.qkv_w, bias)
            for norm in (a.iq_norm, a.ik_norm):
                norm[:a.rotary_dim], norm[a.rotary_dim:] = 0.0, 1.0
    return model


def test_m3_near_tie_block_flips_of_a_correct_candidate_are_replayed_and_accepted():
    assert check_op("rms_norm", trunc_rms_norm) == []
    model = tied_m3()
    w = make_workload(model, PREFILL, seed=3)
    ref, rec = verify.routed_step(registry, model, w, {}, None)
    picks = _picks(rec.calls, "block_topk")
    assert verify.pick_depths(model) == [1, 2] and len(picks) == 2
    assert picks[0].ids.shape == (48, model.spec.num_kv_heads, 2) and picks[0].unit.shape == (48, 2)
    reason, ties, cand = _check(model, w, {"rms_norm": trunc_rms_norm}, ref, rec.calls)
    assert reason is None, reason
    flipped = sum(int((r.ids != c.ids).any(-1).any(-1).sum()) for r, c in zip(picks, _picks(cand.calls, "block_topk")))
    n, worst = ties.picks["block_topk"]
    assert n == flipped and flipped >= 5 and 0.0 <= worst < 2 * verify.TIE_RTOL[torch.bfloat16], ties.summary()
    assert "M3 block: " in ties.summary() and "picked other blocks at near-ties" in ties.summary()
    free, _ = verify.routed_step(registry, model, w, {"rms_norm": trunc_rms_norm}, None)
    model.step(w)
    assert verify.compare_logits(free, ref, torch.bfloat16, "free") is not None


def test_m3_a_skewed_index_query_is_rejected_by_name():
    model = build_model("minimax+tiny", dtype=torch.bfloat16, seed=0)
    w = make_workload(model, PREFILL, seed=3)
    ref, rec = verify.routed_step(registry, model, w, {}, None)
    iq = model.blocks[1].attn.iq_norm
    reason, _, _ = _check(model, w, {"rms_norm": _skewed(rms_norm, iq)}, ref, rec.calls)
    assert reason is not None and "p: M3 block picks differ beyond ties: " in reason, reason


def test_block_pick_flips_count_a_query_once_and_never_excuse_a_forced_block():
    inf = float("inf")
    scores = torch.tensor([[[inf, 2.0, 1.99, 0.5, -inf], [inf, 3.0, 1.0, 0.0, -inf]]] * 2)   # [T 2, Hk 2, 5 blocks]
    ref = verify.PickCall("block_topk", torch.tensor([[[0, 1], [0, 1]]] * 2), scores, torch.ones(2, 2))
    cand = torch.tensor([[[0, 2], [0, 2]],                  # both heads flip: the query's worst gap (2.0) counts
                         [[1, 2], [0, 1]]])                 # the forced block 0 left out: never a tie
    tok, gap = verify.pick_flips(ref, cand)
    assert tok.tolist() == [0, 1]
    assert gap[0].item() == pytest.approx(2.0) and gap[1].item() == inf
    tok, gap = verify.pick_flips(ref, torch.tensor([[[0, 2], [0, 1]], [[0, 1], [0, 1]]]))
    assert tok.tolist() == [0] and gap[0].item() == pytest.approx(0.01, abs=1e-6)


def test_picks_cross_the_wire_with_their_op():
    from persistent_engine.executor.routes import calls_from_wire, calls_to_wire

    call = verify.PickCall("block_topk", torch.zeros(3, 2, 4, dtype=torch.long), torch.randn(3, 2, 6),
                           torch.ones(3, 2))
    back = calls_from_wire(calls_to_wire([call]))[0]
    assert back.op == "block_topk" and torch.equal(back.scores, call.scores) and torch.equal(back.ids, call.ids)


# ----------------------------------------------------------------------------- the judge's verification
@pytest.mark.parametrize("name,op,label", [("glm+tiny", "layer_norm", "DSA indexer: "),
                                           ("minimax+tiny", "rms_norm", "M3 block: ")])
def test_the_judge_replays_the_picks_its_executors_report(name, op, label, verify_candidate):
    """Through executors (the picks on the wire both ways), random weights: the norm rounded toward zero flips
    a few picks at near-ties of their own (DSA: 1 query, gap 7e-4; M3: 7 queries, worst 0.019), all excused."""
    points = [WorkloadPoint(phase="decode", batch=8, context=40, chunk=1, weight=0.5),
              WorkloadPoint(phase="prefill", batch=2, context=16, chunk=24, weight=0.5)]
    threads, grad = torch.get_num_threads(), torch.is_grad_enabled()
    try:
        e = eng.Engine(eng.EngineConfig(model=name, variants=2, points=points))
        ver, detail = verify_candidate(e, TRUNC_SOURCE.replace("OP", op))
    finally:
        torch.set_num_threads(threads)
        torch.set_grad_enabled(grad)
    assert ver.ok, ver.reasons
    assert label in detail and "at near-ties" in detail, detail
