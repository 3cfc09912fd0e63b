"""The calibrated layer-level logits bound (persistent_engine/verification/tolerance.py): re-rounding moves elements by
exactly one ulp, the bound follows the slice's measured noise within its floor and cap, and the engine
applies its per-point bound in layer-level verification and bench's spot re-check."""

import pytest
import torch

from persistent_engine.judge import engine as eng
from persistent_engine import io_struct as io
from persistent_engine.verification import tolerance, verify
from persistent_engine.io_struct import WorkloadPoint

POINTS = [WorkloadPoint(phase="decode", batch=4, context=16, chunk=1, weight=0.5),
          WorkloadPoint(phase="prefill", batch=2, context=0, chunk=8, weight=0.5)]

# fused_add_rms_norm as the reference, except (in bf16) a relative jitter of 2^-12 before the final cast, so
# some outputs round to the neighbouring bf16 value: a correct op whose rounding differs
JITTER = '''import torch
def fused_add_rms_norm(x, residual, weight, eps):
    r = x.float() + residual.float()
    y = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    if x.dtype == torch.bfloat16:
        y = y * (1 + 2.0 ** -12 * torch.cos(torch.arange(y.shape[-1], device=y.device, dtype=torch.float32) * 1.7))
    return y.to(x.dtype), r.to(x.dtype)
OVERRIDES = {"fused_add_rms_norm": fused_add_rms_norm}
'''


def _ulp(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One ulp of dtype at each value of y (fp64), computed from the exponent another way than tolerance.py."""
    return torch.finfo(dtype).eps * torch.exp2(torch.floor(torch.log2(y.abs().double())))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_reround_moves_about_half_the_elements_by_exactly_one_ulp(dtype):
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(4096, generator=g) * 10).to(dtype)
    x[:7] = 0
    x[7] = float("inf")
    y = tolerance.reround(x, torch.Generator().manual_seed(5))
    assert y.dtype == dtype and y.shape == x.shape
    assert torch.equal(y[:8], x[:8])                             # zeros and inf stay
    d = (y.double() - x.double())[8:]
    moved = d != 0
    assert 0.42 < float(moved.float().mean()) < 0.58
    assert torch.equal(d[moved].abs(), _ulp(x[8:], dtype)[moved])
    assert 0.4 < float((d[moved] > 0).float().mean()) < 0.6        # up and down alike
    again = tolerance.reround(x, torch.Generator().manual_seed(5))
    assert torch.equal(again, y)                                   # the generator decides, nothing else


def test_reround_leaves_everything_but_floating_tensors_alone():
    ids = torch.arange(10)
    g = torch.Generator().manual_seed(0)
    assert tolerance.reround(ids, g) is ids
    assert tolerance.reround(None, g) is None
    w = tolerance.Rerounded(lambda a: (a.float() * 2, a), g)(ids)
    assert w[1] is ids and not torch.equal(w[0], ids.float() * 2)


def test_the_bound_follows_the_noise_between_floor_and_cap():
    floor = verify.LOGIT_RTOL[torch.bfloat16]
    assert tolerance.tolerance(torch.bfloat16, 0.0) == floor
    assert tolerance.tolerance(torch.bfloat16, floor / tolerance.NOISE_FACTOR / 2) == floor
    assert tolerance.tolerance(torch.bfloat16, 0.06) == pytest.approx(0.06 * tolerance.NOISE_FACTOR)
    assert tolerance.tolerance(torch.bfloat16, 0.9) == tolerance.TOL_CAP
    assert tolerance.tolerance(torch.float32, 0.0) == verify.LOGIT_RTOL[torch.float32]


@pytest.fixture(scope="module")
def dense():
    threads, grad = torch.get_num_threads(), torch.is_grad_enabled()
    yield eng.Engine(eng.EngineConfig(model="tiny-dense", variants=2, points=POINTS))
    torch.set_num_threads(threads)
    torch.set_grad_enabled(grad)


def test_engine_calibrates_every_point_and_leaves_the_workloads_as_they_were(dense):
    assert len(dense.logit_noise) == len(POINTS) and all(len(r) == 2 for r in dense.logit_noise)
    for noise_row, tol_row in zip(dense.logit_noise, dense.logit_tol):
        for n, t in zip(noise_row, tol_row):
            assert 0 < n < 0.5
            assert t == tolerance.tolerance(dense.dtype, n) >= verify.LOGIT_RTOL[dense.dtype]
    assert "calibration" in dense.startup
    for i, ws in enumerate(dense.workloads):                     # the re-rounded step's K/V writes undone
        for v, w in enumerate(ws):
            assert torch.equal(dense.model.step(w), dense.ref[i][v])
    st = dense.handle(io.Status())
    assert st.logit_noise == dense.logit_noise and st.logit_tol == dense.logit_tol


def test_engine_applies_its_per_point_bound_in_verification_and_the_spot_recheck(dense):
    saved = dense.logit_tol
    load = dense.handle(io.LoadCandidate(source=JITTER))
    assert load.ok, load.reasons
    try:
        assert dense.handle(io.Verify(seed=3)).ok                # within the calibrated bound
        dense.logit_tol = [[1e-9] * len(r) for r in saved]
        bench = dense.handle(io.Bench(samples=2))
        assert not bench.ok and any(r.startswith("spot re-check") and "> 1e-09" in r for r in bench.reasons), \
            bench.reasons
        ver = dense.handle(io.Verify(seed=3))
        assert not ver.ok and any("logits differ from the reference" in r and "> 1e-09" in r for r in ver.reasons), \
            ver.reasons
    finally:
        dense.logit_tol = saved
        dense.handle(io.Unload())


def test_moe_calibration_runs_under_routing_replay():
    e = eng.Engine(eng.EngineConfig(model="tiny-moe", variants=1, points=POINTS[:1]))
    # the reference's routes were recorded for the calibration run, which replays them
    assert e.moe_routes._routes.get((0, 0)) is not None
    assert 0 < e.logit_noise[0][0] < 0.5
