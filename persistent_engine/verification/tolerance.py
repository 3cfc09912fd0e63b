"""The layer-level logits tolerance of one slice, calibrated at start-up from the slice's own rounding noise.

``verify.LOGIT_RTOL`` (5e-2 for bf16) bounds the relative L2 error between a candidate's logits and the
reference's. How far a correct rounding change grows on its way to the logits depends on the slice: a few
dense layers keep it far below 5e-2, eight random-weight MoE layers magnify it until one correct kernel
sits at the bound (qwen3-moe's slow tier on the H200: the split-KV attention at 0.050-0.053, and two correct
kernels together beyond it, so the composition dropped a fused MoE that had passed on its own).

Calibration measures that magnification instead of guessing it. For every (point, variant) the engine runs
the baseline step once more with every leaf op's floating outputs re-rounded (``reround``: each nonzero
finite element moved by one ulp of its dtype, down with probability 1/4, up with 1/4 — a correct
implementation that rounds differently, at every op at once), under routing replay where the slice routes
(a flip at a near-tie takes the reference's experts, as in a candidate's check). The relative error of those
logits is the slice's ``noise``; a candidate must come within

    tol = min(TOL_CAP, max(LOGIT_RTOL[dtype], NOISE_FACTOR x noise))

NOISE_FACTOR = 1, as measured: re-rounding every op on half the elements is already a strong model of a
correct implementation (a reordered fp32 reduction changes few bf16 roundings, a fusion skips a few
intermediate roundings), so composed plans of correct kernels sit well below ``noise``. On the H200
(``benchmarks/verify_tolerance.py``, results ``benchmarks/results/h200-verify-tolerance-*.json``) the plans'
errors were 0.22-0.53 of the noise for llama-1b v5 and qwen3-moe v6 and 0.02-0.06 for deepseek v4, at every
point, variant and tier. Bounds then: llama-1b fast 0.05, slow 0.05-0.062; qwen3-moe fast 0.05, slow
0.05-0.099 (its decode points 0.091-0.099, where plan v6 reached 0.052); deepseek fast 0.061-0.087, slow
0.11-0.25. TOL_CAP = 0.25: a wrong kernel (a dropped term, a wrong weight, zeros) lands near 1 at layer
level, and op-level verification keeps its fixed per-op bounds whatever the slice, so the layer-level bound
never decides alone whether an op computes the right function. Cost: one eager step per (point, variant) at
start-up.
"""

from __future__ import annotations

import torch

from persistent_engine.verification import verify

NOISE_FACTOR = 1.0
TOL_CAP = 0.25


def reround(t, gen: torch.Generator):
    """``t`` with each nonzero finite element moved by one ulp of its dtype, down with probability 1/4 and up
    with 1/4 (draws from ``gen``, on ``t``'s device); anything but a floating tensor is returned as is."""
    if not (isinstance(t, torch.Tensor) and t.is_floating_point()) or t.numel() == 0:
        return t
    f = t.double() if t.dtype == torch.float64 else t.float()
    # |f| in [2^(e-1), 2^e): one ulp of t's dtype is eps x 2^(e-1); f +- ulp is exact in f's dtype
    ulp = torch.ldexp(torch.full_like(f, torch.finfo(t.dtype).eps), torch.frexp(f).exponent - 1)
    u = torch.rand(f.shape, generator=gen, device=f.device)
    step = (u >= 0.75).to(f.dtype) - (u < 0.25).to(f.dtype)
    step = step.masked_fill(~torch.isfinite(f) | (f == 0), 0.0)
    return (f + step * ulp).to(t.dtype)


class Rerounded:
    """An op implementation whose floating outputs (a tensor or a tuple of them) are re-rounded."""

    def __init__(self, fn, gen: torch.Generator):
        self.fn, self.gen = fn, gen

    def __call__(self, *args):
        out = self.fn(*args)
        if isinstance(out, tuple):
            return tuple(reround(o, self.gen) for o in out)
        return reround(out, self.gen)


def tolerance(dtype: torch.dtype, noise: float) -> float:
    """The layer-level bound for a slice whose re-rounded reference is ``noise`` away (relative L2)."""
    return min(TOL_CAP, max(verify.LOGIT_RTOL.get(dtype, 5e-2), NOISE_FACTOR * noise))


def calibrate(registry, model, workloads: list[list], refs: list[list], routes: verify.ReferenceRoutes,
              ops_at: list[set], device: torch.device, dtype: torch.dtype, seed: int) -> list[list[float]]:
    """``noise[i][v]``: the relative error of point i, variant v's logits when every leaf op re-rounds its
    outputs (the baseline, so nothing may override an op now). Each workload is stepped once more with the
    plain baseline afterwards, so the K/V slots the re-rounded step wrote hold the reference's values again."""
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed) * 7919 + 1)
    leaves = [n for n in registry.names() if not registry.get(n).composite]
    noise: list[list[float]] = []
    for i, ws in enumerate(workloads):
        row = []
        for v, w in enumerate(ws):
            wrapped = {n: Rerounded(registry.current(n), gen) for n in leaves}
            if verify.decides(ops_at[i]):           # the re-rounded router and indexer, replayed like a candidate's
                router, ref_routes = wrapped.pop("moe_route"), routes.get((i, v), model, w, refs[i][v], dtype)
                out, _ = verify.routed_step(registry, model, w, wrapped, ref_routes, router=router)
            else:
                with registry.override(wrapped):
                    out = model.step(w)
            row.append(verify.rel_err(out, refs[i][v]))
            model.step(w)
        noise.append(row)
    return noise
