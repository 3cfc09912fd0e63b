"""Nemotron-H (nemotron_h): the Mamba-2 forms agree (recurrent vs the SSD chunked scan), the mixer matches an
independent transcription of HF's torch_forward, the states are carried (prefill then decode equals a longer
prefill), a candidate that corrupts the state is rejected."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from persistent_engine.io_struct import WorkloadPoint
from persistent_engine.models.decoder import build_model
from persistent_engine.models.kv_cache import KVCache
from persistent_engine.models.nemotron import Mamba2Mixer
from persistent_engine.models.spec import ModelSpec
from persistent_engine.ops import mamba
from persistent_engine.ops.contract import check_op
from persistent_engine.inputs.workloads import make_workload

D64 = torch.float64


def _ssd_inputs(t, h=4, p=6, n=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, p, generator=g, dtype=D64)
    dt = F.softplus(torch.randn(t, h, generator=g, dtype=D64))
    a = -torch.rand(h, generator=g, dtype=D64) - 0.1
    b, c = torch.randn(t, h, n, generator=g, dtype=D64), torch.randn(t, h, n, generator=g, dtype=D64)
    return x, dt, a, b, c, torch.randn(h, p, n, generator=g, dtype=D64)


@pytest.mark.parametrize("t,chunk", [(1, 8), (37, 8), (64, 64), (50, 16)])
def test_recurrent_and_chunked_forms_agree(t, chunk):
    args = _ssd_inputs(t)
    y_r, s_r = mamba.recurrent_ssd(*args)
    y_c, s_c = mamba.chunk_ssd(*args, chunk=chunk)
    assert torch.allclose(y_r, y_c, atol=1e-10) and torch.allclose(s_r, s_c, atol=1e-10)
    assert not torch.allclose(s_r, args[-1])                                       # the state moved


def test_ssd_prefill_equals_decode_steps_with_groups():
    """Ragged prefill of 2 sequences over their states == ssd_decode token by token (B, C in 2 groups of 2 heads)."""
    g = torch.Generator().manual_seed(1)
    h, p, n, gr, lens = 4, 3, 5, 2, [7, 3]
    t = sum(lens)
    x, dt = torch.randn(t, h, p, generator=g, dtype=D64), torch.randn(t, h, generator=g, dtype=D64)
    b, c = torch.randn(t, gr, n, generator=g, dtype=D64), torch.randn(t, gr, n, generator=g, dtype=D64)
    a_log, d = torch.randn(h, generator=g, dtype=D64), torch.randn(h, generator=g, dtype=D64)
    bias = torch.randn(h, generator=g, dtype=D64)
    state = torch.randn(2, h, p, n, generator=g, dtype=D64)
    y, new = mamba.ssd_prefill(x, dt, a_log, b, c, d, bias, state, torch.tensor([0, 7, 10], dtype=torch.int32))
    for i, (s0, s1) in enumerate(((0, 7), (7, 10))):
        s = state[i:i + 1]
        for j in range(s0, s1):
            o, s = mamba.ssd_decode(x[j:j + 1], dt[j:j + 1], a_log, b[j:j + 1], c[j:j + 1], d, bias, s)
            assert torch.allclose(o[0], y[j], atol=1e-10)
        assert torch.allclose(s[0], new[i], atol=1e-10)


def test_conv_prefill_then_decode_equals_a_longer_prefill():
    g = torch.Generator().manual_seed(2)
    x, w, bias = torch.randn(9, 6, generator=g), torch.randn(6, 4, generator=g), torch.randn(6, generator=g)
    zero = torch.zeros(1, 6, 3)
    want, _ = mamba.mamba_conv_prefill(x, zero, w, bias, torch.tensor([0, 9], dtype=torch.int32))
    got, conv = mamba.mamba_conv_prefill(x[:8], zero, w, bias, torch.tensor([0, 8], dtype=torch.int32))
    last, _ = mamba.mamba_conv_decode(x[8:], conv, w, bias)
    assert torch.allclose(torch.cat([got, last]), want, atol=1e-6)


def _hf_mixer(h, w, spec, chunk=4):
    """NemotronHMamba2Mixer.torch_forward's no-cache branch (HF transformers, Apache-2.0) for one sequence from zero
    states, transcribed equation by equation: causal conv1d with K-1 left padding + silu, then the "ssd naive"
    chunked computation (segment sums, diagonal and off-diagonal blocks), D skip, Zamba2RMSNormGated, out_proj
    (without torch_forward's clamp of dt at time_step_min, which HF's and vLLM's kernel paths do not apply)."""
    hm, p, n, gr = spec.mamba_num_heads, spec.mamba_head_dim, spec.ssm_state_size, spec.mamba_n_groups
    inner = spec.mamba_inner
    seq = h.shape[0]
    gate, xbc, dt = (h @ w["in_w"].T).split([inner, spec.mamba_conv_dim, hm], -1)
    conv = F.conv1d(xbc.T[None], w["conv_w"][:, None], w["conv_b"], padding=spec.mamba_conv_kernel - 1,
                    groups=xbc.shape[1])[0, :, :seq]
    x, b, c = F.silu(conv.T).split([inner, gr * n, gr * n], -1)
    dt = F.softplus(dt + w["dt_bias"])
    a = -torch.exp(w["A_log"])
    x = x.reshape(seq, hm, p)
    b = b.reshape(seq, gr, n).repeat_interleave(hm // gr, 1)
    c = c.reshape(seq, gr, n).repeat_interleave(hm // gr, 1)
    pad = (chunk - seq % chunk) % chunk
    d_res = w["D"][:, None] * x
    xd, ad = F.pad(x * dt[..., None], (0, 0, 0, 0, 0, pad)), F.pad(a * dt, (0, 0, 0, pad))
    b, c = F.pad(b, (0, 0, 0, 0, 0, pad)), F.pad(c, (0, 0, 0, 0, 0, pad))
    nc = xd.shape[0] // chunk
    xd, b, c = xd.view(nc, chunk, hm, p), b.view(nc, chunk, hm, n), c.view(nc, chunk, hm, n)
    ad = ad.view(nc, chunk, hm).permute(2, 0, 1)                                    # [h, c, l]
    acs = ad.cumsum(-1)

    def segsum(v):                                                                  # HF segment_sum
        L = v.shape[-1]
        v = v[..., None].expand(*v.shape, L).masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(-1), 0)
        return v.cumsum(-2).masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(0), -torch.inf)
    lmat = torch.exp(segsum(ad))                                                    # [h, c, l, s]
    y_diag = torch.einsum("clhn,cshn,hcls,cshp->clhp", c, b, lmat, xd)
    decay = torch.exp(acs[..., -1:] - acs)                                          # [h, c, l]
    states = torch.einsum("clhn,hcl,clhp->chpn", b, decay, xd)
    states = torch.cat([torch.zeros_like(states[:1]), states])
    decay_chunk = torch.exp(segsum(F.pad(acs[..., -1], (1, 0))))                    # [h, c+1, c+1]
    states = torch.einsum("hzc,chpn->zhpn", decay_chunk, states)[:-1]
    y_off = torch.einsum("clhn,chpn,hcl->clhp", c, states, torch.exp(acs))
    y = (y_diag + y_off).reshape(-1, hm, p)[:seq] + d_res
    hs = y.reshape(seq, inner) * F.silu(gate)                                       # Zamba2RMSNormGated
    grp = hs.view(seq, gr, -1)
    hs = (grp * torch.rsqrt(grp.pow(2).mean(-1, keepdim=True) + spec.rms_norm_eps)).view(seq, inner) * w["mamba_norm"]
    return hs @ w["out_w"].T


class _WL:
    def __init__(self, phase, cache, cu):
        self.phase, self.cache, self.cu_seqlens_q = phase, cache, cu


def test_mixer_matches_an_independent_hf_torch_forward_transcription():
    spec = ModelSpec.from_name("nemotron+tiny")
    model = build_model(spec, layers=[0], dtype=D64, seed=3)
    w = {k.split(".", 2)[2]: v for k, v in model.params.items() if k.startswith("layers.0.")}
    mixer = Mamba2Mixer(spec, model.params, "layers.0.", 0)
    h = torch.randn(11, spec.hidden_size, generator=torch.Generator().manual_seed(4), dtype=D64)
    cache = KVCache(block_size=16, block_tables=torch.zeros(1, 1, dtype=torch.int32))
    cache.state[0] = torch.zeros(1, spec.mamba_num_heads, spec.mamba_head_dim, spec.ssm_state_size, dtype=D64)
    cache.conv[0] = torch.zeros(1, spec.mamba_conv_dim, spec.mamba_conv_kernel - 1, dtype=D64)
    cache.state_next[0], cache.conv_next[0] = cache.state[0].clone(), cache.conv[0].clone()
    got = mixer(h @ w["in_w"].T, _WL("prefill", cache, torch.tensor([0, 11], dtype=torch.int32)))
    want = _hf_mixer(h, w, spec)
    assert spec.mamba_n_groups == 2 and torch.allclose(got, want, atol=1e-9), float((got - want).abs().max())
    # the decode branch: one more token from the carried states equals the 12-token transcription's last row
    h2 = torch.cat([h, torch.randn(1, spec.hidden_size, dtype=D64)])
    cache.commit_states()
    step = mixer(h2[11:] @ w["in_w"].T, _WL("decode", cache, None))
    assert torch.allclose(step, _hf_mixer(h2, w, spec)[11:], atol=1e-9)


def _tokens(n, batch=2, seed=0):
    return torch.randint(0, 256, (batch, n), generator=torch.Generator().manual_seed(seed))


def _prefill(model, ids, cache=None, context=0):
    b, n = ids.shape
    wl = make_workload(model, WorkloadPoint(phase="prefill", batch=b, context=context, chunk=n), cache=cache,
                       token_ids=ids.flatten(), fill="zeros", capacity=32)
    return model.step(wl), wl.cache


@pytest.mark.parametrize("name", ["nemotron+tiny", "nemotron-3-nano+tiny"])
def test_prefill_then_decode_equals_a_longer_prefill(name):
    model = build_model(ModelSpec.from_name(name), dtype=torch.float32)
    ids = _tokens(10)
    want, _ = _prefill(model, ids)
    _, cache = _prefill(model, ids[:, :6])
    cache.commit_states()
    _, cache = _prefill(model, ids[:, 6:9], cache=cache, context=6)          # a second chunk: conv + SSM state carried
    cache.commit_states()
    wl = make_workload(model, WorkloadPoint(phase="decode", batch=2, context=9), cache=cache, token_ids=ids[:, 9])
    got = model.step(wl)
    assert torch.allclose(got, model.step(wl))                                 # a step can run again
    assert torch.allclose(got, want, atol=1e-4), float((got - want).abs().max())
    cache.commit_states()
    stale = make_workload(model, WorkloadPoint(phase="decode", batch=2, context=9), cache=cache, token_ids=ids[:, 9])
    assert not torch.allclose(model.step(stale), want, atol=1e-3)            # the state is really used


def test_op_contracts_hold_and_a_state_dropping_decode_is_rejected():
    for name in ("ssd_decode", "ssd_prefill", "mamba_conv_decode", "mamba_conv_prefill", "mamba_gated_norm",
                 "relu2", "moe_experts_relu2"):
        assert check_op(name, getattr(mamba, name, None) or _relu2(name), dtypes=(torch.float32,)) == [], name

    def drops(x, dt, a_log, b, c, d, dt_bias, state):
        y, _ = mamba.ssd_decode(x, dt, a_log, b, c, d, dt_bias, state)
        return y, state.clone()                                                # right output, the state not advanced
    assert any("output 1" in r for r in check_op("ssd_decode", drops, dtypes=(torch.float32,)))


def _relu2(name):
    from persistent_engine.ops import relu2

    return getattr(relu2, name)
