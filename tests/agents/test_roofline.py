"""The offline search's prior: an op's share of the step times its headroom to the roofline
(agents.roofline.headroom, agents.offline.op_priors), on the Kimi-K3 slice's H200 profile and on
hand-made profiles at and off the roofline."""

import random
from pathlib import Path

import pytest

from agents import AgentContext
from agents.offline import BanditStrategy, EvolutionStrategy, KernelSearchAgent, OfflineTeam, SearchState, op_priors, op_shares
from agents.roofline import HEADROOM_UNKNOWN, headroom, op_rooflines
from agents.templates import dims_of
from cost_model import get_hardware
from persistent_engine.io_struct import WorkloadPoint
from persistent_engine.models.spec import ModelSpec

KIMI = ModelSpec.from_config_file(Path(__file__).parent / "fixtures" / "kimi-k3-slice.json")
DECODE = {"phase": "decode", "batch": 16, "context": 1213, "chunk": 1, "weight": 0.828078}
PREFILL = {"phase": "prefill", "batch": 1, "context": 7, "chunk": 2596, "weight": 0.171922}

# {op: (ms, calls)} of the baseline profile of the H200 Kimi-K3 slice search (v3 plan, cuda events per op)
KIMI_DECODE_MS = {"attn_res": (1.73388, 6), "embedding": (0.068716, 1), "kda_decode": (1.13065, 2),
                  "linear": (2.16447, 23), "lm_head": (0.614136, 1), "mla_decode": (0.486566, 1),
                  "mla_q_absorb": (0.166097, 1), "mla_v_up": (0.110106, 1), "moe_experts_situ": (2.53424, 2),
                  "moe_route": (0.346769, 2), "rms_norm": (1.48878, 11), "rms_norm_gated": (0.304715, 2),
                  "short_conv_decode": (0.262995, 2), "sigmoid_mul": (0.07666, 1), "situ_and_mul": (0.593677, 3)}
KIMI_PREFILL_MS = {"attn_res": (5.06041, 6), "embedding": (0.109703, 1), "kda_prefill": (87.5985, 2),
                   "linear": (15.9553, 23), "lm_head": (0.634287, 1), "mla_prefill": (43.5395, 1),
                   "mla_q_absorb": (1.16075, 1), "mla_v_up": (1.31745, 1), "moe_experts_situ": (19.6673, 2),
                   "moe_route": (0.488628, 2), "rms_norm": (2.83444, 11), "rms_norm_gated": (1.47292, 2),
                   "short_conv_prefill": (5.38702, 2), "sigmoid_mul": (0.434007, 1), "situ_and_mul": (3.45431, 3)}


def _profile(*points: tuple[dict, dict]) -> dict:
    return {"per_point": [{"point": p, "ops": {op: {"ms": ms, "calls": calls} for op, (ms, calls) in ops.items()}}
                          for p, ops in points]}


KIMI_PROFILE = _profile((DECODE, KIMI_DECODE_MS), (PREFILL, KIMI_PREFILL_MS))


def _ctx(profile, spec, hw):
    return AgentContext(board=None, run_id=None, evaluate=None, profile=profile,
                        points=[WorkloadPoint.from_dict(p["point"]) for p in profile["per_point"]],
                        spec=spec, ops={}, deadline=0.0, hw=hw)


def test_kimi_slice_draws_kda_decode_before_the_linear_and_moe_templates():
    team = OfflineTeam(device="cuda")
    agent = KernelSearchAgent("k0", team)
    ctx = _ctx(KIMI_PROFILE, KIMI, "h200")
    arms = team.arms(ctx)
    shares = agent.shares(ctx, arms)
    # by share alone moe_experts_situ (19%) and linear (16%) come first; both are near their roofline
    by_share = op_shares(KIMI_PROFILE)
    assert by_share["moe_experts_situ"] > by_share["linear"] > by_share["kda_decode"]
    assert shares["kda_decode"] > 10 * shares["moe_experts_situ"] and shares["kda_decode"] > 10 * shares["linear"]
    assert shares["linear"] >= agent.strategy.min_share          # at the roofline: drawn last, not never

    state, tried, rng, drawn = SearchState(), set(), random.Random(0), []
    for _ in range(10):
        c = agent.strategy.propose(arms, shares, state, tried, dims_of(KIMI), rng)
        tried.add(c.key())
        state.record(c, 0.0)
        drawn.append(c.template.name)
    assert drawn[0] == "kda_decode.triton"
    linear = [i for i, name in enumerate(drawn) if name.startswith("linear.")]
    assert len(linear) == 3 and drawn.index("kda_decode.triton") < linear[0]   # GEMV, tiled, skinny: once each
    assert drawn.index("kda_decode.triton") < drawn.index("moe_experts_situ.triton_fused")
    first = EvolutionStrategy().propose(arms, shares, SearchState(), set(), dims_of(KIMI), random.Random(0))
    assert first.template.name == "kda_decode.triton"


def test_kimi_slice_headroom_per_point():
    decode = headroom(KIMI, "h200", WorkloadPoint.from_dict(DECODE), KIMI_PROFILE, ["kda_decode", "linear", "moe_experts_situ"])
    assert decode["kda_decode"] == pytest.approx(0.906, abs=0.01)      # 1.13 ms against a 0.106 ms roofline
    assert decode["moe_experts_situ"] < 0.15                            # takes moe_experts' row
    assert decode["mla_decode"] == HEADROOM_UNKNOWN                     # no cost-model row


def test_an_op_at_its_roofline_has_prior_about_zero():
    spec, hw = ModelSpec.from_name("tiny-dense"), get_hardware("h200")
    point = {"phase": "decode", "batch": 8, "context": 64, "chunk": 1, "weight": 1.0}
    rows = op_rooflines(spec, hw, WorkloadPoint.from_dict(point), ["linear", "rms_norm", "silu_and_mul"])
    lin, act = rows["linear"], rows["silu_and_mul"]
    profile = _profile((point, {"linear": (lin["roofline_ms"], lin["rows"]),                  # at the roofline
                                "silu_and_mul": (4 * act["roofline_ms"], act["rows"]),        # 4x off it
                                "rms_norm": (0.1 * lin["roofline_ms"], 1)}))                  # no row: neutral
    room = headroom(spec, "h200", WorkloadPoint.from_dict(point), profile, ["linear", "silu_and_mul", "rms_norm"])
    assert room["linear"] == pytest.approx(0.0, abs=1e-9) and room["silu_and_mul"] == pytest.approx(0.75)
    assert "rms_norm" not in rows and room["rms_norm"] == HEADROOM_UNKNOWN
    faster = _profile((point, {"linear": (0.5 * lin["roofline_ms"], lin["rows"])}))         # below: clipped
    assert headroom(spec, "h200", WorkloadPoint.from_dict(point), faster, ["linear"])["linear"] == 0.0
    half = _profile((point, {"linear": (lin["roofline_ms"], lin["rows"] // 2)}))   # half the GEMMs (a composite
    assert headroom(spec, "h200", WorkloadPoint.from_dict(point), half, ["linear"])["linear"] == pytest.approx(0.5)   # runs the rest)

    priors, shares = op_priors(profile, spec, "h200", ["linear", "silu_and_mul"]), op_shares(profile)
    assert shares["linear"] > 0.3 and priors["linear"] == pytest.approx(0.0, abs=1e-9)
    assert priors["silu_and_mul"] == pytest.approx(0.75 * shares["silu_and_mul"])
    assert list(priors) == ["silu_and_mul", "rms_norm", "linear"]


def test_unknown_roofline_gives_the_neutral_headroom():
    assert headroom(KIMI, "h200", WorkloadPoint.from_dict(DECODE), KIMI_PROFILE, [])["attn_res"] == HEADROOM_UNKNOWN
    shares = op_shares(KIMI_PROFILE)
    for spec, hw in ((None, "h200"), (KIMI, None), (KIMI, "no-such-gpu")):
        assert op_priors(KIMI_PROFILE, spec, hw) == pytest.approx({op: HEADROOM_UNKNOWN * s for op, s in shares.items()})
    flat = {"linear": 0.003, "rms_norm": 0.001}                          # no points: share x neutral
    assert op_priors(flat, KIMI, "h200") == pytest.approx({"linear": 0.375, "rms_norm": 0.125})
    assert op_priors(None) == {} and op_priors({"per_point": []}, KIMI, "h200") == {}


def test_without_a_profile_every_op_with_a_template_is_equally_likely():
    team = OfflineTeam(device="cuda")
    arms = team.arms(_ctx({"per_point": []}, KIMI, "h200"))
    shares = KernelSearchAgent("k0", team).shares(_ctx({"per_point": []}, KIMI, "h200"), arms)
    assert set(shares) == {t.op for t in arms} and len(set(shares.values())) == 1
    assert BanditStrategy().propose(arms, shares, SearchState(), set(), dims_of(KIMI), random.Random(0)) is not None
