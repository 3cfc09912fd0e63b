"""The compressed_attention Triton template (compressed_attention.triton: DeepSeek-V4's shared-KV MQA over the
sliding window plus compressed entries, with sinks) under TRITON_INTERPRET=1: the rendered candidate honours the op
contract (persistent_engine.ops.contract.check_op, reference in persistent_engine/ops/csa.py) for fp32 and bf16 on
HCA (all entries), CSA (random picks: -1, repeats, future ids), window-only layers, contexts shorter than the window,
more heads than one head block, decode and chunked prefill, split-KV shares (2, 4, and chosen by the batch);
hand-made picks (-1, repeats, future and past-n_entries ids) match the reference closely; a sample of the knob space
that passes the library's check at V4-Flash sizes passes too; the check rejects what it should; a kernel one window
key short fails the contract; the offline kernel search draws it on a V4-Flash profile and the benchmark search
runs it at deepseek+tiny's decode shapes; at V4-Flash's real decode dims (GPU only) it is capturable and replays
bitwise like eager."""

import importlib.util
import random
from pathlib import Path

import pytest
import torch

from agents import AgentContext, op_catalog
from agents.offline import BanditStrategy, KernelSearchAgent, OfflineTeam, SearchState
from agents.roofline import HEADROOM_UNKNOWN
from agents.templates import Choice, dims_of, get_template, load_candidate, render_candidate, templates_for
from persistent_engine.io_struct import WorkloadPoint
from persistent_engine.models.spec import ModelSpec
from persistent_engine.ops import registry
from persistent_engine.ops.contract import check_op, compare_outputs
from persistent_engine.ops.dsa import token_seq_pos

from cuda_graph_support import eager_and_replayed

NAME = "compressed_attention.triton"
OP = "compressed_attention"
# 16-row tiles: the window (W 24) and the entries take several masked steps, shared by 2 split-KV programs
SMALL = {"CSAA_BLOCK_H": 16, "CSAA_BLOCK_T": 16, "CSAA_BLOCK_E": 16, "CSAA_NUM_WARPS": 8, "CSAA_NUM_STAGES": 1,
         "CSAA_SPLITS": 2}
# 4 shares of 16-row tiles: some shares see no key at all (a short window, few entries)
SPLIT4 = {**SMALL, "CSAA_SPLITS": 4, "CSAA_BLOCK_T": 32}
BASE = {"BS": 4, "D": 32}
SHAPES = [
    {**BASE, "B": 3, "chunk": 1, "ctx": 70, "Hq": 4, "W": 24, "r": 4, "topk": 7},       # CSA decode
    {**BASE, "B": 1, "chunk": 1, "ctx": 70, "Hq": 4, "W": 24, "r": 4, "topk": 7},       # batch 1: SPLITS 0 -> 4
    {**BASE, "B": 2, "chunk": 1, "ctx": 400, "Hq": 4, "W": 24, "r": 4, "topk": 150},    # 150 picks, repeats past 128
    {**BASE, "B": 2, "chunk": 1, "ctx": 150, "Hq": 20, "W": 24, "r": 8, "topk": 0},     # HCA, Hq 20 > BLOCK_H 16
    {**BASE, "B": 2, "chunk": 1, "ctx": 40, "Hq": 4, "W": 24, "r": 0, "topk": 0},       # window only
    {**BASE, "B": 2, "chunk": 1, "ctx": 9, "Hq": 4, "W": 24, "r": 4, "topk": 0},        # context < window
    {**BASE, "B": 2, "chunk": 5, "ctx": 45, "Hq": 4, "W": 24, "r": 4, "topk": 6},       # CSA prefill chunk
    {**BASE, "B": 2, "chunk": 3, "ctx": 30, "Hq": 2, "W": 8, "r": 8, "topk": 0},        # HCA prefill chunk
]


def _impl(knobs):
    t = get_template(NAME)
    assert t.check(knobs) == [], knobs
    return load_candidate(render_candidate([Choice(t, knobs)]))["OVERRIDES"][OP]


def test_the_library_lists_the_template_for_cuda_only():
    assert NAME in {t.name for t in templates_for(OP, device="cuda")}
    assert templates_for(OP, device="cpu") == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("knobs", [get_template(NAME).default(), SMALL, SPLIT4], ids=["default", "small", "split4"])
def test_candidate_passes_the_contract(knobs, dtype):
    assert check_op(OP, _impl(knobs), dtypes=(dtype,), shapes=SHAPES) == []


def test_picks_with_none_repeats_and_future_ids_match_the_reference():
    """CSA picks made by hand: -1, an id picked twice (the reference attends a set), an id at or past the causal
    threshold (p + 1) // r (future, for the chunk's early queries) and one past the sequence's n_entries."""
    d = registry.get(OP)
    shape = {**BASE, "B": 2, "chunk": 5, "ctx": 45, "Hq": 4, "W": 24, "r": 4, "topk": 6}
    args = list(d.make_inputs(shape, torch.float32, "cpu", 5))
    ne = args[5].shape[1]                                   # 11: seq 0 has 11 entries, seq 1 (ctx 42) 10
    t = args[0].shape[0]
    ids = torch.tensor([[-1, 3, 3, ne - 1, 0, -1], [ne - 1, ne - 2, 1, 1, 1, 5]] * (t // 2), dtype=torch.int64)
    args[7] = ids
    got, ref = _impl(SMALL)(*args), d.reference(*args)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    # the picks do hold a future id: ne - 1 is at or past (p + 1) // r for seq 0's first query (p = 40)
    seq, pos = token_seq_pos(args[3], args[4], t)
    assert ((ne - 1) >= (pos + 1) // 4).any() and ((ne - 1) >= args[6][seq]).any()


def test_a_sample_of_the_knob_space_passes_the_check_and_the_contract():
    t = get_template(NAME)
    dims = dims_of(ModelSpec.from_name("deepseek-v4-flash"))
    rng = random.Random(0)
    valid = []
    while len(valid) < 5:
        knobs = {k.name: rng.choice(k.values) for k in t.knobs}
        if not t.check(knobs, dims) and knobs not in valid:
            valid.append(knobs)
    for knobs in valid:
        assert check_op(OP, _impl(knobs), dtypes=(torch.bfloat16,), shapes=SHAPES[:3] + SHAPES[5:6]) == [], knobs


def test_the_check_rejects_oversized_tiles_and_head_blocks():
    t = get_template(NAME)
    base = t.default()
    flash = dims_of(ModelSpec.from_name("deepseek-v4-flash"))
    assert t.check(base, flash) == []
    assert any("per thread" in r for r in t.check({**base, "CSAA_BLOCK_H": 64, "CSAA_NUM_WARPS": 4}, flash))
    assert any("shared memory" in r for r in t.check({**base, "CSAA_BLOCK_E": 128, "CSAA_NUM_STAGES": 3,
                                                      "CSAA_NUM_WARPS": 16}, flash))
    tiny = dims_of(ModelSpec.from_name("tiny-dense"))
    if tiny["heads"] <= 16:
        assert any("twice the model's" in r for r in t.check({**base, "CSAA_BLOCK_H": 64, "CSAA_NUM_WARPS": 16},
                                                              tiny))
    assert any("not in" in r for r in t.check({**base, "CSAA_BLOCK_T": 24}))


def test_a_kernel_one_window_key_short_fails_the_contract():
    impl = _impl(SMALL)

    def short(q, kv, bt, cu, cl, entries, n_entries, ids, ratio, window, sinks, scale):
        return impl(q, kv, bt, cu, cl, entries, n_entries, ids, ratio, window - 1, sinks, scale)
    reasons = check_op(OP, short, dtypes=(torch.float32,), shapes=SHAPES[:1])
    assert any("mismatch" in r for r in reasons), reasons


def test_the_offline_search_proposes_it_on_a_v4_flash_profile():
    """The kernel search's arms on CUDA hold the template; its prior at a DeepSeek-V4-Flash decode profile (the
    slice's: compressed_attention 10.5% of the step) is the share times the default headroom (the reference cost
    model has no compressed_attention row, as for the other DSA / window templates), and the bandit draws valid
    settings of it at V4-Flash's dims."""
    spec = ModelSpec.from_name("deepseek-v4-flash")
    point = WorkloadPoint(phase="decode", batch=32, context=4096, chunk=1, weight=1.0)
    fractions = {"hc_pre": 0.275, "linear": 0.2, "compressed_attention": 0.105, "rms_norm": 0.097, "other": 0.323}
    profile = {"per_point": [{"point": point.to_dict(), "step_ms": 20.0,
                              "ops": {op: {"ms": 20.0 * f, "calls": 1} for op, f in fractions.items()}}]}
    team = OfflineTeam(device="cuda")
    ctx = AgentContext(board=None, run_id=None, evaluate=None, profile=profile, points=[point], spec=spec,
                       ops=op_catalog(), deadline=0.0, hw="h200")
    arms = team.arms(ctx)
    assert NAME in {t.name for t in arms}
    shares = KernelSearchAgent("k", team).shares(ctx, arms)
    assert shares["compressed_attention"] == pytest.approx(0.105 * HEADROOM_UNKNOWN)
    dims, state, tried, rng = dims_of(spec), SearchState(), set(), random.Random(0)
    strategy = BanditStrategy()
    drawn = []
    for _ in range(40):
        choice = strategy.propose(arms, shares, state, tried, dims, rng)
        tried.add(choice.key())
        state.record(choice, -1.0)
        drawn.append(choice)
    ours = [c for c in drawn if c.template.name == NAME]
    assert ours and all(c.template.check(c.knobs, dims) == [] for c in ours)


def test_benchmark_search_finds_a_valid_setting():
    """benchmarks/templates.py's search (render, load, compare to the reference, time) runs this template at
    deepseek+tiny's decode shapes (window-only, CSA, HCA), as the H200 run will at deepseek-v4-flash."""
    spec = importlib.util.spec_from_file_location(
        "tkcc_bench_templates", Path(__file__).resolve().parents[2] / "benchmarks" / "templates.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    model = ModelSpec.from_name("deepseek+tiny")
    d, t = registry.get(OP), get_template(NAME)
    assert t in bench.templates_for(OP, "cuda")
    shapes = d.shapes(model, WorkloadPoint(phase="decode", batch=3, context=40, chunk=1, weight=1.0))
    assert {s["r"] for s in shapes} == set(model.compress_ratios)
    for shape in shapes:
        args = d.make_inputs(shape, torch.bfloat16, "cpu", 0)
        ref_hi = (d.reference(*bench._upcast(args)),)
        knobs, best_t, tried, rejected = bench.search(t, d, args, ref_hi, bench.Timer("cpu", 1),
                                                      bench.dims_of(model), 2, random.Random(0), fit=SMALL)
        assert knobs is not None and rejected == 0 and tried == 2 and best_t > 0, (shape, knobs)


@pytest.mark.gpu
def test_cuda_graph_capture_at_v4_flash_dims():
    """Decode at V4-Flash's real dims (64 heads, D 512, W 128; window-only, CSA r 4 with 512 picks, HCA r 128) is
    capturable (no host sync), replays bitwise like eager and is within tolerance of the fp32 reference."""
    fn = _impl(get_template(NAME).default())
    d = registry.get(OP)
    spec = ModelSpec.from_name("deepseek-v4-flash")
    for batch, ctx in ((1, 4096), (32, 2048)):
        shapes = d.shapes(spec, WorkloadPoint(phase="decode", batch=batch, context=ctx, chunk=1, weight=1.0))
        assert {s["r"] for s in shapes} == {0, 4, 128}
        for shape in shapes:
            args = d.make_inputs(shape, torch.bfloat16, "cuda", 0)
            eager, out = eager_and_replayed(lambda: fn(*args))
            assert torch.equal(out, eager), shape
            hi = d.reference(*(a.float() if torch.is_tensor(a) and a.is_floating_point() else a for a in args))
            assert compare_outputs((out,), (hi,), *d.tolerance(torch.bfloat16)) == [], shape
