"""Tie-aware layer-level verification of MoE slices: routing flips at near-ties of the reference's router
are excused (their sequences left out of the logits comparison), flips with a clear margin and wrong
logits elsewhere are still rejected, dense models are checked exactly as before. Real engines in process
(tiny-moe: sigmoid + bias; a qwen3-moe-shaped 2-layer slice scaled down: softmax top-4 of 32)."""

import dataclasses
import json
import pathlib

import pytest
import torch

from persistent_engine.judge import engine as eng
from persistent_engine import io_struct as io
from persistent_engine.verification import verify
from persistent_engine.io_struct import WorkloadPoint

QWEN3 = pathlib.Path(eng.__file__).parents[1] / "models" / "configs" / "qwen3-moe.json"
POINTS = [WorkloadPoint(phase="decode", batch=16, context=8, chunk=1, weight=0.5),
          WorkloadPoint(phase="prefill", batch=4, context=0, chunk=8, weight=0.5)]

# moe_route as the reference computes it, but choosing on logits moved by AMP x the row's logit RMS
# (a cosine over expert ids): only tokens whose reference gap is below ~2 AMP change experts. in_model
# gates the perturbation and the deliberate faults to the model's steps: router logits there come out
# of a bf16 linear (exactly bf16-representable), the op-level generator's fp32 logits are not, so
# op-level verification passes.
ROUTE = '''import torch
def moe_route(router_logits, correction_bias, top_k, scoring, n_group, topk_group, norm_topk_prob,
              routed_scaling_factor):
    logits = router_logits.float()
    t, e = logits.shape
    in_model = bool(torch.equal(logits, logits.bfloat16().float()))
    rms = logits.pow(2).mean(-1, keepdim=True).sqrt()
    wobble = torch.cos(torch.arange(e, device=logits.device, dtype=torch.float32) * 2.3)
    moved = logits + wobble * ((AMP if in_model else 0.0) * rms)
    f = (lambda z: torch.softmax(z, dim=-1)) if scoring == "softmax" else torch.sigmoid
    scores = f(logits)
    choice = f(moved) if correction_bias is None else f(moved) + correction_bias.float()
    if n_group > 1:
        grouped = choice.view(t, n_group, e // n_group)
        gs = grouped.topk(2, dim=-1).values.sum(-1) if correction_bias is not None else grouped.max(dim=-1).values
        keep = torch.zeros_like(gs, dtype=torch.bool).scatter_(1, gs.topk(topk_group, dim=-1).indices, True)
        choice = choice.masked_fill(~keep.repeat_interleave(e // n_group, dim=1), float("-inf"))
    ids = choice.topk(top_k, dim=-1).indices
    if in_model and MISROUTE:            # token 0's k-th expert replaced by its worst-scored one
        ids = ids.clone()
        ids[0, -1] = choice[0].argmin()
    w = scores.gather(1, ids)
    if norm_topk_prob:
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    return w * routed_scaling_factor * (WSCALE if in_model else 1.0), ids
OVERRIDES = {"moe_route": moe_route}
'''


def route_src(amp=0.0, misroute=False, wscale=1.0) -> str:
    return ROUTE.replace("AMP", repr(amp)).replace("MISROUTE", repr(misroute)).replace("WSCALE", repr(wscale))


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    cfg = json.loads(QWEN3.read_text())
    cfg.update(hidden_size=64, head_dim=16, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
               moe_intermediate_size=32, num_experts=32, num_experts_per_tok=4, num_hidden_layers=2,
               vocab_size=256, max_position_embeddings=4096)
    path = tmp_path_factory.mktemp("qwen3") / "config.json"
    path.write_text(json.dumps(cfg))
    threads, grad = torch.get_num_threads(), torch.is_grad_enabled()
    yield eng.Engine(eng.EngineConfig(model=str(path), variants=2, points=POINTS))
    torch.set_num_threads(threads)
    torch.set_grad_enabled(grad)


@pytest.fixture(scope="module")
def tiny_moe():
    threads, grad = torch.get_num_threads(), torch.is_grad_enabled()
    yield eng.Engine(eng.EngineConfig(model="tiny-moe", variants=2, points=POINTS))
    torch.set_num_threads(threads)
    torch.set_grad_enabled(grad)


# ----------------------------------------------------------------------------- engines
def test_near_tie_flips_are_excused_on_the_qwen3_slice(qwen3, verify_candidate):
    ver, detail = verify_candidate(qwen3, route_src(amp=2e-3))
    assert ver.ok, ver.reasons
    assert detail.startswith("MoE routing: ") and "tokens flipped at near-ties" in detail, detail
    flipped = int(detail.split("MoE routing: ")[1].split()[0])
    left_out = int(detail.split("; ")[1].split()[0])
    assert 1 <= flipped and 1 <= left_out <= verify.MAX_EXCLUDED * 40       # 16 + 4 sequences, 2 variants
    # the plain check rejects the same candidate: the flipped sequences' logits differ a lot
    rec = verify.RouteRecorder(qwen3.registry.current("moe_route"))
    ns: dict = {}
    exec(route_src(amp=2e-3), ns)
    diffs = []
    for i, ws in enumerate(qwen3.workloads):
        for v, w in enumerate(ws):
            with qwen3.registry.override({"moe_route": ns["moe_route"]}):
                out = qwen3.model.step(w)
            diffs.append(verify.compare_logits(out, qwen3.ref[i][v], qwen3.dtype, "plain"))
            qwen3.workload_guard.restore()
    assert any(d and "logits differ" in d for d in diffs), diffs
    assert rec.calls == []                                     # wrapping alone records nothing


def test_bench_spot_recheck_compares_the_rows_verification_kept(qwen3):
    """The same near-tie candidate is timed: the spot re-check of the outputs produced while timed skips
    the sequences layer-level verification left out, so the candidate is not rejected there."""
    load = qwen3.handle(io.LoadCandidate(source=route_src(amp=2e-3)))
    assert load.ok, load.reasons
    try:
        ver = qwen3.handle(io.Verify(seed=11))
        assert ver.ok, ver.reasons
        kept = dict(qwen3.tie_kept_rows)
        assert kept and all(not bool(k.all()) for k in kept.values())     # some rows were left out
        bench = qwen3.handle(io.Bench(samples=3))
        assert bench.ok, bench.reasons
    finally:
        qwen3.handle(io.Unload())
    assert qwen3.tie_kept_rows == {}


def test_the_unperturbed_candidate_flips_nothing(qwen3, verify_candidate):
    ver, detail = verify_candidate(qwen3, route_src())
    assert ver.ok and detail == "", (ver.reasons, detail)


def test_a_wrong_expert_with_a_clear_margin_is_rejected_by_name(qwen3, verify_candidate):
    ver, _ = verify_candidate(qwen3, route_src(misroute=True))
    assert not ver.ok
    assert len(ver.reasons) == 2 and all("MoE routing differs beyond ties: " in r for r in ver.reasons), ver.reasons
    # token 0 misrouted in both layers: counted once (a token's later flips are consequences of its first)
    assert ver.reasons[0].startswith("layer-level decode b16 ctx8 variant 0: MoE routing differs beyond ties: 1 tokens")
    worst = float(ver.reasons[0].split("worst margin ")[1].split()[0])
    assert worst > 10 * verify.TIE_RTOL[torch.bfloat16]


def test_a_candidate_wrong_elsewhere_is_still_rejected(qwen3, tiny_moe, verify_candidate):
    # same experts, routed weights 1.3x: the logits differ, and from the second layer on the router's
    # inputs are wrong too, so clear-margin flips may be what is seen first
    for e in (qwen3, tiny_moe):
        ver, _ = verify_candidate(e, route_src(wscale=1.3))
        assert not ver.ok and ver.reasons
        assert all("logits differ from the reference (relative error" in r or "MoE routing differs beyond ties" in r
                   for r in ver.reasons), ver.reasons
    # the near-tie perturbation does not hide the fault (the kept-sequence case: test_tie_check_rows_...)
    ver, _ = verify_candidate(qwen3, route_src(amp=2e-3, wscale=1.3))
    assert not ver.ok and ver.reasons, ver.reasons


# linear as the reference computes it, except the router's logits (32 outputs: qwen3 fixture's experts),
# moved by AMP x their RMS and scaled by SCALE: upstream of the router, so verification replays the
# reference's experts (verify.RouteReplay) and checks the router's own choices against its ties
LINEAR = '''import torch
import torch.nn.functional as F
def linear(x, weight, bias):
    out = F.linear(x, weight, bias)
    if out.shape[-1] == 32 and x.dtype == torch.bfloat16:
        o = out.float()
        rms = o.pow(2).mean(-1, keepdim=True).sqrt()
        wobble = torch.cos(torch.arange(32, device=o.device, dtype=torch.float32) * 2.3)
        out = ((o + wobble * (AMP * rms)) * SCALE).to(out.dtype)
    return out
OVERRIDES = {"linear": linear}
'''


def linear_src(amp=0.0, scale=1.0) -> str:
    return LINEAR.replace("AMP", repr(amp)).replace("SCALE", repr(scale))


def test_a_candidate_upstream_of_the_router_runs_with_the_reference_experts(qwen3, verify_candidate):
    ver, detail = verify_candidate(qwen3, linear_src(amp=5e-3))
    assert ver.ok, ver.reasons
    # its router flipped some near-ties, but every sequence was compared (0 left out of verification)
    assert "tokens flipped at near-ties" in detail and "; 0 of 40 sequences left out" in detail, detail
    # the flipped sequences are left out of bench's spot re-check only, and bench passes
    load = qwen3.handle(io.LoadCandidate(source=linear_src(amp=5e-3)))
    assert load.ok, load.reasons
    try:
        assert qwen3.handle(io.Verify(seed=11)).ok
        kept = dict(qwen3.tie_kept_rows)
        assert kept and all(not bool(k.all()) for k in kept.values())
        bench = qwen3.handle(io.Bench(samples=3))
        assert bench.ok, bench.reasons
    finally:
        qwen3.handle(io.Unload())


def test_replay_does_not_hide_a_misrouting_router(qwen3, verify_candidate):
    ver, _ = verify_candidate(qwen3, linear_src(amp=0.02))            # clear-margin flips: the router is wrong
    assert not ver.ok and "MoE routing differs beyond ties" in ver.reasons[0], ver.reasons
    assert "first flips only" not in ver.reasons[0]           # replayed: every layer's choices checked


def test_route_replay_returns_the_reference_experts_weighted_from_this_runs_logits():
    from persistent_engine.ops import moe

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 8, generator=g)
    args = (logits, None, 2, "softmax", 1, 1, True, 1.0)
    ref_w, ref_ids = moe.moe_route(*args)
    ref = verify.RouteCall(logits, ref_ids.sort(-1).values, None, "softmax", 1, 1)
    rep = verify.RouteReplay(moe.moe_route, [ref])
    sharp = (logits * 1.3, *args[1:])                          # same choices, sharper weights
    w, ids = rep(*sharp)                                         # nothing flipped: the router's own output
    assert all(torch.equal(a, b) for a, b in zip((w, ids), moe.moe_route(*sharp)))
    assert torch.equal(ids.sort(-1).values, ref.ids) and torch.equal(rep.calls[0].ids, ref.ids)
    assert not torch.allclose(w.sort(-1).values, ref_w.sort(-1).values, atol=1e-3)   # not the reference's
    other = torch.randn(5, 8, generator=g)                       # its own choice differs: recorded, replaced
    rep = verify.RouteReplay(moe.moe_route, [ref])
    w, ids = rep(other, *args[1:])
    own = moe.moe_route(other, *args[1:])[1].sort(-1).values
    assert torch.equal(ids.sort(-1).values, ref.ids) and torch.equal(rep.calls[0].ids, own)
    assert not torch.equal(own, ref.ids)
    # row by row: a token whose own set is the reference's gets exactly what its router returned (the
    # free-running run's slot order and weights); a flipped one the reference's experts in ITS slot order
    mixed = logits.clone()
    mixed[2] = other[2]
    ref = verify._route_call((logits, *args[1:]), (ref_w, ref_ids))
    assert torch.equal(ref.order, ref_ids) and torch.equal(ref.ids, ref_ids.sort(-1).values)
    own_w, own_ids = moe.moe_route(mixed, *args[1:])
    flip = (own_ids.sort(-1).values != ref.ids).any(-1)
    assert flip.tolist() == [False, False, True, False, False]
    w, ids = verify.RouteReplay(moe.moe_route, [ref])(mixed, *args[1:])
    assert torch.equal(ids[~flip], own_ids[~flip]) and torch.equal(w[~flip], own_w[~flip])
    assert torch.equal(ids[2], ref_ids[2])
    assert torch.allclose(w[2], moe.route_weights(mixed[2:3], ref_ids[2:3], "softmax", True, 1.0)[0])
    assert torch.equal(rep(other, *args[1:])[1], moe.moe_route(other, *args[1:])[1])   # beyond the reference's calls


def test_the_fused_moe_template_passes_verification_on_the_qwen3_slice(qwen3, verify_candidate):
    """The Triton fused-MoE template (interpreted on CPU) through the engine's whole verification on a
    2-MoE-layer slice: op-level at the points' shapes, then layer-level with routing replay."""
    from agents.templates import Choice, get_template, render_candidate

    t = get_template("moe_experts.triton_fused")
    # up to 16 pairs per call through the GEMVs (the op's small examples), above through align + grouped
    # GEMMs (both points: 64 and 128 pairs)
    knobs = {**t.default(), "MOE_GEMV_MAX_PAIRS": 16, "MOE_BLOCK_M": 16, "MOE_BLOCK_N": 16, "MOE_BLOCK_K": 16,
             "MOE_NUM_STAGES": 1}
    ver, detail = verify_candidate(qwen3, render_candidate([Choice(t, knobs)]))
    assert ver.ok, ver.reasons
    assert detail == "" or "; 0 of 40 sequences left out" in detail, detail


def test_near_tie_flips_are_excused_on_tiny_moe_sigmoid_with_bias(tiny_moe, verify_candidate):
    ver, detail = verify_candidate(tiny_moe, route_src(amp=4e-3))
    assert ver.ok, ver.reasons
    assert "tokens flipped at near-ties" in detail, detail
    ver, _ = verify_candidate(tiny_moe, route_src(misroute=True))
    assert not ver.ok and "MoE routing differs beyond ties" in ver.reasons[0], ver.reasons


def test_dense_model_check_is_unchanged(verify_candidate):
    e = eng.Engine(eng.EngineConfig(model="tiny-dense", layers=[0, 1], variants=1,
                                    points=POINTS[:1]))
    good = ("import torch\n"
            "def fused_add_rms_norm(x, residual, weight, eps):\n"
            "    s = x.float() + residual.float()\n"
            "    n = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * weight.float()\n"
            "    return n.to(x.dtype), s.to(x.dtype)\n"
            "OVERRIDES = {'fused_add_rms_norm': fused_add_rms_norm}\n")
    ver, detail = verify_candidate(e, good)
    assert ver.ok and detail == "", ver.reasons
    bad = ("import torch\n"
           "def lm_head(x, weight):\n"
           "    out = torch.matmul(x.float(), weight.float().t())\n"
           "    return out * (1.2 if x.shape[0] == 16 and weight.shape[0] == 256 and x.dtype == torch.bfloat16 "
           "and bool(torch.equal(weight.float().sum(), weight.float().sum())) and WRONG else 1.0)\n"
           "WRONG = False\nOVERRIDES = {'lm_head': lm_head}\n")
    assert verify_candidate(e, bad)[0].ok
    assert e.moe_routes._routes == {}                       # no MoE point: nothing recorded
    out = e.model.step(e.workloads[0][0])
    assert verify.compare_logits(out * 1.2, e.ref[0][0], e.dtype, "x").startswith(
        "x: logits differ from the reference (relative error 0.2")


# ----------------------------------------------------------------------------- the comparison itself
def _call(logits, ids, scoring="softmax", bias=None, n_group=1, topk_group=1):
    return verify.RouteCall(torch.tensor(logits, dtype=torch.float32), torch.tensor(ids).sort(-1).values,
                            None if bias is None else torch.tensor(bias, dtype=torch.float64), scoring,
                            n_group, topk_group)


def test_route_flips_measures_the_gap_in_the_reference_criterion():
    ref = _call([[3.0, 2.0, 2.0, -1.0], [3.0, 2.0, 1.0, 0.0], [3.0, 2.0, 1.99, 0.0]], [[0, 1], [0, 1], [0, 1]])
    cand = torch.tensor([[0, 2], [0, 3], [0, 2]])
    tok, gap = verify.route_flips(ref, cand)
    rms = torch.tensor([[3.0, 2.0, 2.0, -1.0], [3.0, 2.0, 1.0, 0.0], [3.0, 2.0, 1.99, 0.0]]).pow(2).mean(-1).sqrt()
    assert tok.tolist() == [0, 1, 2]
    assert gap[0] == 0.0                                                  # an exact tie
    assert gap[1] == pytest.approx(2.0 / float(rms[1]))                   # expert 3 is 2 logits behind
    assert gap[2] == pytest.approx(0.01 / float(rms[2]), rel=1e-4)
    assert verify.route_flips(ref, torch.tensor([[0, 1], [0, 1], [1, 0]]))[0].numel() == 0   # order is free
    assert torch.isinf(verify.route_flips(ref, torch.tensor([[0, 9], [0, 1], [0, 1]]))[1]).all()   # out of range
    assert torch.isinf(verify.route_flips(ref, torch.tensor([[2, 2], [0, 1], [0, 1]]))[1]).all()   # twice


def test_route_flips_sigmoid_bias_and_groups():
    # sigmoid + bias: criterion sigmoid(l) + b; expert 1 wins by its bias, expert 2 nearly ties it
    ref = _call([[0.0, 0.0, 0.002]], [[0, 1]], scoring="sigmoid", bias=[1.0, 0.5, 0.5])
    tok, gap = verify.route_flips(ref, torch.tensor([[0, 2]]))
    assert tok.tolist() == [0] and gap[0] == 0.0                          # 2 is better: a valid choice
    ref = _call([[0.0, 0.01, 0.0]], [[0, 1]], scoring="sigmoid", bias=[1.0, 0.5, 0.5])
    gap = verify.route_flips(ref, torch.tensor([[0, 2]]))[1]
    rms = (0.01 ** 2 / 3) ** 0.5
    assert float(gap[0]) == pytest.approx(0.01 / rms, rel=1e-3)           # ~ the logit gap, in RMS units
    # groups (softmax, 2 groups of 2, one kept): experts from two groups break the limit: never excused
    ref = _call([[3.0, 2.9, 2.95, -5.0]], [[0, 1]], n_group=2, topk_group=1)
    assert torch.isinf(verify.route_flips(ref, torch.tensor([[0, 2]]))[1]).all()
    # the other group whole: its score (max 2.95) is 0.05 logits behind the kept one's (3.0), and within
    # it nothing better was left out, so the gap is the group gap in logit units (the row's steepest slope)
    sm = torch.softmax(ref.logits.double(), -1)[0]
    s = sm * (1 - sm)
    gap = float(verify.route_flips(ref, torch.tensor([[2, 3]]))[1][0])
    assert gap == pytest.approx(float((sm[0] - sm[2]) / s.max() / ref.logits.pow(2).mean().sqrt()), rel=1e-6)
    assert 0 < gap < 2 * 0.05 / float(ref.logits.pow(2).mean().sqrt())      # ~ the 0.05-logit group gap
    # a clear group gap (the other group 2 logits behind) is far beyond any band
    far = _call([[3.0, 2.9, 1.0, -5.0]], [[0, 1]], n_group=2, topk_group=1)
    assert float(verify.route_flips(far, torch.tensor([[2, 3]]))[1][0]) > 10 * verify.TIE_RTOL[torch.bfloat16]
    # within a switched group the experts are still compared (top-1)
    ref1 = _call([[3.0, 2.9, 2.95, 2.0]], [[0]], n_group=2, topk_group=1)
    assert float(verify.route_flips(ref1, torch.tensor([[3]]))[1][0]) > float(
        verify.route_flips(ref1, torch.tensor([[2]]))[1][0]) > 0                      # 3 is behind 2 in its group


def test_tie_check_rows_prefill_taint_and_budget():
    # prefill, 2 sequences of 3 tokens, one layer; token 1 (sequence 0) flips at an exact tie
    logits = [[3.0, 2.0, 2.0, 0.0]] * 6
    ref_calls = [_call(logits, [[0, 1]] * 6)]
    cand = [_call(logits, [[0, 1], [0, 2]] + [[0, 1]] * 4)]
    cu = torch.tensor([0, 3, 6], dtype=torch.int32)
    ref = torch.randn(2, 8)
    out = ref.clone()
    out[0] += 5.0                                                       # the flipped sequence differs
    t = verify.TieCheck(torch.bfloat16)
    assert t.compare(out, ref, "p", ref_calls, cand, cu) is None
    assert (t.rows, t.excluded, t.excused) == (2, 1, 1)
    assert t.budget_reason().startswith("layer-level: MoE routing differs beyond ties: near-tie flips left 1 of 2")
    for _ in range(2):                                                  # 1 of 6 sequences: within 25%
        assert t.compare(ref.clone(), ref, "p", ref_calls, ref_calls, cu) is None
    assert t.budget_reason() is None and "1 tokens flipped at near-ties" in t.summary()
    out[1] += 5.0                                                       # the kept sequence is wrong too
    assert "over 1 of 2 sequences; 1 left out" in verify.TieCheck(torch.bfloat16).compare(out, ref, "p", ref_calls,
                                                                                        cand, cu)
    # unmatched routing (a layer missing): the plain check, which sees the difference
    assert "logits differ" in verify.TieCheck(torch.bfloat16).compare(out, ref, "p", ref_calls, [], cu)



def test_tie_band_widens_with_the_depth_of_the_moe_layer():
    tie = verify.TIE_RTOL[torch.bfloat16]
    logits = [[3.0, 2.0, 2.0 - 0.0966, 0.0]]                           # expert 2 is ~1.5 bands behind expert 1
    ref, flip = _call(logits, [[0, 1]]), _call(logits, [[0, 2]])
    gap = float(verify.route_flips(ref, flip.ids)[1][0])
    assert tie < gap < 2 * tie
    cu, out = torch.tensor([0, 1], dtype=torch.int32), torch.randn(1, 8, generator=torch.Generator().manual_seed(0))
    # in the step's first MoE layer the flip is beyond the band; the second layer's is its consequence
    r = verify.TieCheck(torch.bfloat16).compare(out, out.clone(), "p", [ref, ref], [flip, flip], cu)
    assert r is not None and "beyond ties: 1 tokens" in r and f"> {tie:.3g}" in r, r
    # in the second MoE layer the band is twice as wide: excused, its sequence left out
    t = verify.TieCheck(torch.bfloat16)
    assert t.compare(out, out.clone(), "p", [ref, ref], [ref, flip], cu) is None
    assert (t.excused, t.excluded, t.rows) == (1, 1, 1)
    # three bands behind is beyond even the second layer's
    far = _call([[3.0, 2.0, 2.0 - 0.1932, 0.0]], [[0, 1]])
    r = verify.TieCheck(torch.bfloat16).compare(out, out.clone(), "p", [far, far], [far, _call(far.logits.tolist(), [[0, 2]])], cu)
    assert r is not None and f"> {2 * tie:.3g}" in r, r



def test_tie_band_counts_the_dense_layers_above_the_router():
    # GLM-5.2's fast tier (layers 0, 2, 3): its one router sits two dense layers deep, so its band is 3 x the
    # first layer's; the fused MoE's flip of 0.0583 router-logit RMS on the H200 is within it, not beyond
    tie = verify.TIE_RTOL[torch.bfloat16]
    logits = [[3.0, 2.0, 2.0 - 0.0966, 0.0]]                           # ~1.5 first-layer bands behind
    ref, flip = _call(logits, [[0, 1]]), _call(logits, [[0, 2]])
    cu, out = torch.tensor([0, 1], dtype=torch.int32), torch.randn(1, 8, generator=torch.Generator().manual_seed(0))
    assert "beyond ties" in verify.TieCheck(torch.bfloat16).compare(out, out.clone(), "p", [ref], [flip], cu)
    t = verify.TieCheck(torch.bfloat16, depths=[2])
    assert t.compare(out, out.clone(), "p", [ref], [flip], cu, replayed=True) is None and t.excused == 1
    assert "(1 + d) x" in t.summary()
    # a clear margin (a fifth of the RMS: ~6 first-layer bands) stays beyond the depth-2 band
    far = _call([[3.0, 2.0, 2.0 - 0.4, 0.0]], [[0, 1]])
    r = verify.TieCheck(torch.bfloat16, depths=[2]).compare(out, out.clone(), "p", [far], [
        _call(far.logits.tolist(), [[0, 2]])], cu, replayed=True)
    assert r is not None and f"> {3 * tie:.3g}" in r, r
    # depths that do not match the step's routers (another slice) fall back to the MoE layer's index
    assert "beyond ties" in verify.TieCheck(torch.bfloat16, depths=[2, 3]).compare(out, out.clone(), "p", [ref],
                                                                                    [flip], cu)


def test_moe_depths_of_a_slice():
    from persistent_engine.models.decoder import build_model
    from persistent_engine.models.spec import ModelSpec

    glm = build_model("glm+tiny", dtype=torch.float32)                  # layer 0 dense, 1 and 2 MoE
    assert [glm.spec.layer_kind(i) for i in glm.layers] == ["dense", "moe", "moe"]
    assert verify.moe_depths(glm) == [1, 2]
    assert verify.moe_depths(build_model("glm+tiny", layers=[1, 2], dtype=torch.float32)) == [0, 1]
    from types import SimpleNamespace                                   # the real GLM-5.2's fast tier
    glm52 = SimpleNamespace(spec=ModelSpec.from_name("glm"), layers=[0, 2, 3])
    assert verify.moe_depths(glm52) == [2]
    assert verify.moe_depths(object()) is None


def test_the_reference_routing_comes_from_the_baseline_executor(tiny_moe, verify_candidate):
    """The layer-level check takes the reference's routing from the baseline executor (a process like the
    candidate's), and this process's own only where the executor's logits do not match the start-up ones."""
    from persistent_engine.measure import timing

    e = tiny_moe
    e.executor_routes.clear()
    ver, detail = verify_candidate(e, route_src())
    assert ver.ok and detail == "", (ver.reasons, detail)
    assert set(e.executor_routes) == {(i, v) for i in range(len(POINTS)) for v in range(2)}
    for (i, v), calls in e.executor_routes.items():
        own = e.moe_routes.get((i, v), e.model, e.workloads[i][v], e.ref[i][v], e.dtype)
        assert calls is not own and len(calls) == len(own) >= 1
        assert all(torch.equal(a.ids, b.ids) and torch.equal(a.logits, b.logits) for a, b in zip(calls, own))

    class Drifted:                      # a baseline executor whose step no longer matches the reference
        def __init__(self, real):
            self.real = real

        def call(self, msg, timeout_s):
            r = self.real.call(msg, timeout_s)          # a ``steps`` request: one result per step
            return dataclasses.replace(r, results=[dataclasses.replace(x, logits=x.logits * 1.5) for x in r.results])

    real, e.baseline = e.baseline, None
    try:
        e.baseline = Drifted(real)
        e.executor_routes.clear()
        routes = e.reference_routes(0, 1, timing.now_ns() / 1e9 + 60)
        assert routes is e.moe_routes.get((0, 1), e.model, e.workloads[0][1], e.ref[0][1], e.dtype)
    finally:
        e.baseline = real
        e.executor_routes.clear()
