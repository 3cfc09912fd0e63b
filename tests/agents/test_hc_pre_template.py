"""The hc_pre Triton template (hc_pre.triton: DeepSeek-V4 hyper-connection weights, Sinkhorn and collapse) under
TRITON_INTERPRET=1: the rendered candidate honours the op contract (persistent_engine.ops.contract.check_op,
reference in persistent_engine/ops/hc.py) for bf16 and fp32 streams at T in {1, 3, 7}, N = 4, D in {64, 96}
(96: a D-block and a K-chunk that do not divide the row), few Sinkhorn iterations and the real 20; a sample of
the knob space that passes the library's check at V4-Flash sizes runs and passes too; the check rejects the
settings it should; a candidate one Sinkhorn step short fails (the contract can catch a wrong kernel); the
benchmark's search (benchmarks/templates.py) measures it at the tiny DeepSeek-V4's decode shape."""

import importlib.util
import random
from pathlib import Path

import pytest
import torch

from agents.templates import Choice, dims_of, get_template, load_candidate, render_candidate, templates_for
from persistent_engine.models.spec import ModelSpec
from persistent_engine.ops import registry
from persistent_engine.io_struct import WorkloadPoint
from persistent_engine.ops.contract import check_op, compare_outputs

from cuda_graph_support import eager_and_replayed

NAME = "hc_pre.triton"
# split-K 2 over 32-wide K tiles, 2 tokens per program (T = 3, 7: a masked token), 16-wide D-blocks
SMALL = {"HCPR_SPLIT_K": 2, "HCPR_BLOCK_K": 32, "HCPR_BLOCK_T": 2, "HCPR_NUM_WARPS": 1, "HCPR_BLOCK_D": 16,
         "HCPR_COLLAPSE_WARPS": 1}
SHAPES = [{"T": t, "N": 4, "D": d, "iters": it} for (t, d), it in
          zip([(t, d) for t in (1, 3, 7) for d in (64, 96)], (20, 2, 3, 20, 1, 20))]


def _impl(knobs):
    t = get_template(NAME)
    assert t.check(knobs) == [], knobs
    return load_candidate(render_candidate([Choice(t, knobs)]))["OVERRIDES"]["hc_pre"]


def test_the_library_lists_the_template_for_cuda_only():
    assert NAME in {t.name for t in templates_for("hc_pre", device="cuda")}
    assert templates_for("hc_pre", device="cpu") == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("knobs", [get_template(NAME).default(), SMALL], ids=["default", "small"])
def test_candidate_passes_the_contract(knobs, dtype):
    assert check_op("hc_pre", _impl(knobs), dtypes=(dtype,), shapes=SHAPES) == []


def test_outputs_are_the_reference_weights_and_a_doubly_stochastic_comb():
    """Beyond the tolerance check: at fp32 the three outputs agree closely with the reference, comb's columns
    sum to ~1 (the last Sinkhorn step normalises them) and its rows nearly so after 20 iterations."""
    d = registry.get("hc_pre")
    args = d.make_inputs({"T": 7, "N": 4, "D": 96, "iters": 20}, torch.float32, "cpu", 3)
    got, ref = _impl(SMALL)(*args), d.reference(*args)
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype and g.shape == r.shape
        torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-5)
    comb = got[2]
    torch.testing.assert_close(comb.sum(-2), torch.ones(7, 4), atol=1e-4, rtol=0)
    torch.testing.assert_close(comb.sum(-1), torch.ones(7, 4), atol=1e-2, rtol=0)


def test_a_sample_of_the_knob_space_passes_the_check_and_the_contract():
    t = get_template(NAME)
    dims = dims_of(ModelSpec.from_name("deepseek-v4-flash"))
    rng = random.Random(0)
    valid = []
    while len(valid) < 6:
        knobs = {k.name: rng.choice(k.values) for k in t.knobs}
        if not t.check(knobs, dims) and knobs["HCPR_BLOCK_D"] <= 256:      # small D-blocks: fast interpretation
            valid.append(knobs)
    for knobs in valid:
        assert check_op("hc_pre", _impl(knobs), dtypes=(torch.bfloat16,),
                        shapes=[{"T": 3, "N": 4, "D": 96, "iters": 3}]) == [], knobs


def test_the_check_rejects_oversized_tiles_and_short_slices():
    t = get_template(NAME)
    base = t.default()
    assert t.check(base, dims_of(ModelSpec.from_name("deepseek-v4-flash"))) == []
    big = {**base, "HCPR_BLOCK_T": 4, "HCPR_BLOCK_K": 512, "HCPR_NUM_WARPS": 1}      # 64K products on 32 threads
    assert any("per thread" in r for r in t.check(big))
    tiny = dims_of(ModelSpec.from_name("tiny-dense"))                                # K = 4 x hidden
    short = {**base, "HCPR_SPLIT_K": 32, "HCPR_BLOCK_K": 512}
    assert any("split-K slices" in r for r in t.check(short, tiny))
    assert any("twice the row" in r for r in t.check({**base, "HCPR_BLOCK_D": 4096}, tiny))
    assert any("not in" in r for r in t.check({**base, "HCPR_SPLIT_K": 3}))


def test_a_kernel_one_sinkhorn_step_short_fails_the_contract():
    impl = _impl(SMALL)

    def short(x, fn, scale, base, iters, hc_eps, norm_eps):
        return impl(x, fn, scale, base, iters - 1, hc_eps, norm_eps)
    reasons = check_op("hc_pre", short, dtypes=(torch.float32,), shapes=[{"T": 3, "N": 4, "D": 64, "iters": 3}])
    assert any("mismatch" in r for r in reasons), reasons


def test_benchmark_search_finds_a_valid_setting():
    """benchmarks/templates.py's search (render, load, compare to the reference, time) runs this template at
    deepseek+tiny's decode shape, as the H200 run will at deepseek-v4-flash."""
    spec = importlib.util.spec_from_file_location(
        "tkcc_bench_templates", Path(__file__).resolve().parents[2] / "benchmarks" / "templates.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    model = ModelSpec.from_name("deepseek+tiny")
    d, t = registry.get("hc_pre"), get_template(NAME)
    assert t in bench.templates_for("hc_pre", "cuda")
    point = WorkloadPoint(phase="decode", batch=3, context=16, chunk=1, weight=1.0)
    (shape,) = d.shapes(model, point)
    args = d.make_inputs(shape, torch.bfloat16, "cpu", 0)
    ref_hi = tuple(d.reference(*bench._upcast(args)))
    knobs, best_t, tried, rejected = bench.search(t, d, args, ref_hi, bench.Timer("cpu", 1), bench.dims_of(model), 2,
                                                  random.Random(0), fit=SMALL)
    assert knobs is not None and rejected == 0 and tried == 2 and best_t > 0, knobs


@pytest.mark.gpu
def test_cuda_graph_capture_at_v4_flash_dims():
    """Decode at V4-Flash's real dims is capturable (no host sync) and replays bitwise like eager."""
    fn = _impl(get_template(NAME).default())
    d = registry.get("hc_pre")
    spec = ModelSpec.from_name("deepseek-v4-flash")
    for batch in (1, 32):
        (shape,) = d.shapes(spec, WorkloadPoint(phase="decode", batch=batch, context=1, chunk=1, weight=1.0))
        args = d.make_inputs(shape, torch.bfloat16, "cuda", 0)
        eager, out = eager_and_replayed(lambda: fn(*args))
        assert all(torch.equal(o, e) for o, e in zip(out, eager)), batch
        hi = d.reference(*(a.float() if torch.is_tensor(a) and a.is_floating_point() else a for a in args))
        assert compare_outputs(tuple(out), tuple(hi), *d.tolerance(torch.bfloat16)) == [], batch
