"""MLA: the absorbed ops equal the decompressed (per-head K/V) formulation; a real-size DeepSeek-V3
attention block runs on CPU."""

import pytest
import torch
import torch.nn.functional as F

from persistent_engine.models.mla import MLAAttention
from persistent_engine.models.rope import attention_scale, cos_sin_cache, yarn_mscale
from persistent_engine.models.spec import ModelSpec
from persistent_engine.models.weights import init_params, param_specs
from persistent_engine.ops import registry
from persistent_engine.inputs.workloads import Workload, make_workload
from persistent_engine.io_struct import WorkloadPoint


def test_absorbed_decode_equals_decompressed_attention():
    h, dn, dv, lat, r, length = 4, 16, 12, 32, 8, 23
    g = torch.Generator().manual_seed(0)
    c = torch.randn(length, lat, generator=g, dtype=torch.float64)
    k_pe = torch.randn(length, r, generator=g, dtype=torch.float64)
    w_uk = torch.randn(h, dn, lat, generator=g, dtype=torch.float64) / 4
    w_uv = torch.randn(h, dv, lat, generator=g, dtype=torch.float64) / 4
    q_nope = torch.randn(1, h, dn, generator=g, dtype=torch.float64)
    q_pe = torch.randn(1, h, r, generator=g, dtype=torch.float64)
    scale = (dn + r) ** -0.5
    # decompressed: per-head keys [c W_UK^T | k_pe], values c W_UV^T
    k = torch.cat([torch.einsum("ld,hnd->hln", c, w_uk), k_pe[None].expand(h, length, r)], -1)
    v = torch.einsum("ld,hvd->hlv", c, w_uv)
    want = F.scaled_dot_product_attention(torch.cat([q_nope, q_pe], -1).transpose(0, 1), k, v, scale=scale)[:, 0]
    # absorbed, through a paged cache with blocks out of order
    bs = 8
    cache = torch.zeros(5, bs, lat + r, dtype=torch.float64)
    table = torch.tensor([[3, 0, 4]], dtype=torch.int32)
    for j in range(length):
        cache[int(table[0, j // bs]), j % bs] = torch.cat([c[j], k_pe[j]])
    call = lambda n, *a: registry.get(n).reference(*a)          # noqa: E731
    q_abs = call("mla_q_absorb", q_nope, w_uk)
    o = call("mla_decode", q_abs, q_pe, cache, table, torch.tensor([length], dtype=torch.int32), scale)
    got = call("mla_v_up", o, w_uv)[0]
    assert torch.allclose(got, want, atol=1e-10)


def test_deepseek_yarn_scale_and_cache():
    spec = ModelSpec.from_name("deepseek-v3")
    assert attention_scale(spec) == pytest.approx(192 ** -0.5 * yarn_mscale(40, 1.0) ** 2)
    cs = cos_sin_cache(spec, max_pos=64)
    assert cs.shape == (64, 64) and torch.allclose(cs[0, :32], torch.ones(32))   # mscale ratio 1: cos(0) = 1


@pytest.mark.slow
def test_real_size_deepseek_mla_block_runs_on_cpu():
    spec = ModelSpec.from_name("deepseek-v3")
    names = [n for n in param_specs(spec, [0]) if n.startswith("layers.0.") and n.split(".")[-1] not in ("gate_up_w", "down_w")]
    params = init_params(spec, [0], dtype=torch.float32, names=names)
    assert params["layers.0.w_uk"].shape == (128, 128, 512) and params["layers.0.q_b_w"].shape == (128 * 192, 1536)
    cos_sin = cos_sin_cache(spec, max_pos=256)
    attn = MLAAttention(spec, params, "layers.0.", cos_sin, attention_scale(spec))

    class _Model:                      # just enough of a Decoder for make_workload
        device, dtype, max_positions, layers = torch.device("cpu"), torch.float32, 256, [0]

        def alloc_cache(self, batch, tokens, **kw):
            from persistent_engine.models.kv_cache import alloc_kv_cache
            return alloc_kv_cache(spec, [0], batch, tokens, dtype=torch.float32, **kw)
    _Model.spec = spec
    wl: Workload = make_workload(_Model(), WorkloadPoint(phase="decode", batch=2, context=40))
    assert wl.cache.k[0].shape[-1] == 576                               # latent 512 + rope 64
    h = torch.randn(2, spec.hidden_size, generator=torch.Generator().manual_seed(1))
    out = attn(h, wl, wl.cache.k[0])
    assert out.shape == (2, 7168) and torch.isfinite(out).all() and 0.05 < out.std() < 20
