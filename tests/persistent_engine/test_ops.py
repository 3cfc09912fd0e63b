"""Reference ops against independent formulations (torch built-ins, unpaged attention, complex rope)."""

import torch
import torch.nn.functional as F

from persistent_engine.ops import registry
from persistent_engine.ops.attention import rope_cache

ref = {n: registry.get(n).reference for n in registry.names()}


def test_norms_and_activation_match_torch():
    x, w = torch.randn(5, 64, dtype=torch.float64), torch.rand(64, dtype=torch.float64) + 0.5
    assert torch.allclose(ref["rms_norm"](x, w, 1e-5), F.rms_norm(x, (64,), w, 1e-5))
    r = torch.randn(5, 64, dtype=torch.float64)
    normed, summed = ref["fused_add_rms_norm"](x, r, w, 1e-5)
    assert torch.equal(summed, x + r) and torch.allclose(normed, F.rms_norm(x + r, (64,), w, 1e-5))
    y = torch.randn(3, 10, dtype=torch.float64)
    assert torch.allclose(ref["silu_and_mul"](y), F.silu(y[:, :5]) * y[:, 5:])
    xb = torch.randn(4, 64).bfloat16()
    assert ref["rms_norm"](xb, w.bfloat16(), 1e-5).dtype == torch.bfloat16


def test_rotary_matches_complex_rotation_on_the_rotary_dims_only():
    pos = torch.tensor([0, 3, 17, 4095])
    q, k = torch.randn(4, 3, 16, dtype=torch.float64), torch.randn(4, 1, 16, dtype=torch.float64)
    qr, kr = ref["rotary_embedding"](pos, q, k, rope_cache(4096, 8), 8)
    inv = 1.0 / 10000 ** (torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    rot = torch.polar(torch.ones(4, 4, dtype=torch.float64), pos[:, None].double() * inv)[:, None, :]
    want = torch.view_as_real(torch.complex(q[..., :4], q[..., 4:8]) * rot)
    assert torch.allclose(qr[..., :4], want[..., 0], atol=1e-5) and torch.allclose(qr[..., 4:8], want[..., 1], atol=1e-5)
    assert torch.equal(qr[..., 8:], q[..., 8:]) and torch.equal(kr[..., 8:], k[..., 8:])
    assert torch.allclose(qr[0], q[0])                                    # position 0 is the identity


def _unpaged(cache, tables, b, length):
    bs = cache.shape[1]
    return torch.cat([cache[int(tables[b, j // bs])][j % bs][None] for j in range(length)])


def test_attention_decode_matches_sdpa_over_an_unpaged_cache():
    d = registry.get("attention_decode")
    q, kc, vc, bt, cl, scale = d.make_inputs({"B": 4, "Hq": 8, "Hk": 2, "Dh": 16, "Dv": 16, "ctx": 45, "BS": 8},
                                             torch.float64, "cpu", 1)
    assert len(set(cl.tolist())) > 1                                     # ragged lengths
    out = ref["attention_decode"](q, kc, vc, bt, cl, scale)
    for b in range(4):
        k, v = _unpaged(kc, bt, b, int(cl[b])), _unpaged(vc, bt, b, int(cl[b]))
        want = F.scaled_dot_product_attention(q[b][:, None], k.transpose(0, 1).repeat_interleave(4, 0),
                                              v.transpose(0, 1).repeat_interleave(4, 0), scale=scale)[:, 0]
        assert torch.allclose(out[b], want, atol=1e-10)


def test_attention_prefill_is_causal_over_the_cached_prefix():
    d = registry.get("attention_prefill")
    q, kc, vc, bt, cu, cl, scale = d.make_inputs({"B": 2, "chunk": 5, "Hq": 4, "Hk": 4, "Dh": 8, "Dv": 8, "ctx": 30,
                                                  "BS": 4}, torch.float64, "cpu", 2)
    out = ref["attention_prefill"](q, kc, vc, bt, cu, cl, scale)
    for b in range(2):
        n, length = 5, int(cl[b])
        k, v = _unpaged(kc, bt, b, length), _unpaged(vc, bt, b, length)
        mask = torch.arange(length)[None, :] <= torch.arange(length - n, length)[:, None]
        want = F.scaled_dot_product_attention(q[b * n:(b + 1) * n].transpose(0, 1), k.transpose(0, 1),
                                              v.transpose(0, 1), attn_mask=mask, scale=scale).transpose(0, 1)
        assert torch.allclose(out[b * n:(b + 1) * n], want, atol=1e-10)


def test_embedding_lm_head_and_sample():
    w = torch.randn(50, 8)
    ids = torch.tensor([3, 0, 49])
    assert torch.equal(ref["embedding"](ids, w), w[ids])
    logits = ref["lm_head"](torch.randn(2, 8).bfloat16(), w.bfloat16())
    assert logits.dtype == torch.float32 and logits.shape == (2, 50)
    assert torch.equal(ref["sample"](logits, 0.0, 0), logits.argmax(-1))
    lg = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).expand(4000, 3).contiguous()
    draws = ref["sample"](lg, 1.0, 5)
    freq = torch.bincount(draws, minlength=3).double() / 4000
    assert torch.allclose(freq, torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64), atol=0.04)
    assert torch.equal(draws, ref["sample"](lg, 1.0, 5)) and not torch.equal(draws, ref["sample"](lg, 1.0, 6))


def test_rope_scaling_tables():
    from persistent_engine.models.rope import cos_sin_cache
    from persistent_engine.models.spec import ModelSpec
    llama = ModelSpec.from_name("llama-1b")
    base = rope_cache(64, 64, theta=llama.rope_theta)
    scaled = cos_sin_cache(llama, max_pos=64)
    # llama3 scaling keeps high frequencies (short wavelengths) and divides the lowest by the factor (32)
    assert torch.allclose(scaled[:, 0], base[:, 0]) and torch.allclose(scaled[:, 32], base[:, 32])
    inv = 1.0 / llama.rope_theta ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    assert torch.allclose(scaled[1, 31], torch.cos(inv[-1] / 32).float())
    assert cos_sin_cache(ModelSpec.from_name("glm-4.6"), max_pos=8).shape == (8, 64)        # partial rotary: 64 of 128
