"""Gemma-2 and Gemma-3 text against Hugging Face transformers' own modeling_gemma2.py / modeling_gemma3.py (the
public code the families follow): a tiny model with random weights, loaded through tkcc's checkpoint names,
gives HF's logits — sliding and full layers, soft-capped scores and logits (Gemma-2), QK-norm, a local rope base
and linear rope scaling (Gemma-3); and the soft-capped attention op equals HF's eager attention formula."""

import pytest
import torch

from persistent_engine.models.spec import ModelSpec
from persistent_engine.ops.gemma import attention_decode_softcap, attention_prefill_softcap, gelu_tanh_and_mul

transformers = pytest.importorskip("transformers")

BASE = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6, max_position_embeddings=64, sliding_window=5,
            query_pre_attn_scalar=12, tie_word_embeddings=True)
GEMMA2 = dict(BASE, architectures=["Gemma2ForCausalLM"], model_type="gemma2", attn_logit_softcapping=3.0,
              final_logit_softcapping=4.0, rope_theta=10000.0)
GEMMA3 = dict(BASE, architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", sliding_window_pattern=2,
              rope_theta=100000.0, rope_local_base_freq=1000.0, rope_scaling={"rope_type": "linear", "factor": 4.0},
              final_logit_softcapping=None, attn_logit_softcapping=None)


def hf_model(cfg: dict, seed: int):
    hf_cfg = {k: v for k, v in cfg.items() if k not in ("architectures", "model_type")}
    if cfg["model_type"] == "gemma2":
        model = transformers.Gemma2ForCausalLM(transformers.Gemma2Config(**hf_cfg))
    else:
        model = transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**hf_cfg))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():            # norms store w of (1 + w): small values around 0
            p.copy_(torch.randn(p.shape, generator=g) * (p.shape[-1] ** -0.5 if p.dim() > 1 else 0.3))
    return model.eval()




@pytest.mark.parametrize("cfg", [GEMMA2, GEMMA3], ids=["gemma2", "gemma3"])
def test_gemma_matches_hf(cfg, tkcc_last_logits):
    model = hf_model(cfg, seed=1)
    ids = torch.randint(0, 96, (2, 14), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model(ids).logits[:, -1]
    spec = ModelSpec.from_config(cfg, name="gemma-test")
    assert spec.layer_windows == ((5, 0, 5, 0) if cfg is GEMMA2 else (5, 0, 5, 0))
    got = tkcc_last_logits(spec, dict(model.state_dict()), ids)
    torch.testing.assert_close(got, want, rtol=2e-4, atol=2e-4)
    if cfg is GEMMA2:
        assert want.abs().max() < cfg["final_logit_softcapping"]


def _eager(q, k, v, scale, cap, window):
    """HF Gemma-2 eager_attention_forward for one sequence: q[S, Hq, D], k/v[L, Hk, D], queries the last S keys."""
    s, hq, _ = q.shape
    n, hk = k.shape[0], k.shape[1]
    k, v = k.repeat_interleave(hq // hk, dim=1), v.repeat_interleave(hq // hk, dim=1)
    w = torch.einsum("shd,lhd->hsl", q, k) * scale
    w = torch.tanh(w / cap) * cap
    qi, ki = torch.arange(n - s, n)[:, None], torch.arange(n)[None, :]
    keep = (ki <= qi) & ((ki > qi - window) if window else True)
    w = w.masked_fill(~keep, float("-inf")).softmax(-1)
    return torch.einsum("hsl,lhd->shd", w, v)


@pytest.mark.parametrize("window", [0, 4])
def test_softcapped_attention_ops_match_the_eager_formula(window):
    g = torch.Generator().manual_seed(3)
    hq, hk, d, bs, n, s = 4, 2, 8, 4, 11, 3
    k, v = torch.randn(n, hk, d, generator=g), torch.randn(n, hk, d, generator=g)
    q = torch.randn(s, hq, d, generator=g) * 3
    blocks = torch.tensor([[2, 0, 3]], dtype=torch.int32)              # shuffled pages of one sequence
    kc, vc = torch.zeros(4, bs, hk, d), torch.zeros(4, bs, hk, d)
    for j in range(n):
        kc[blocks[0, j // bs], j % bs], vc[blocks[0, j // bs], j % bs] = k[j], v[j]
    lens = torch.tensor([n], dtype=torch.int32)
    want = _eager(q, k, v, 0.3, 2.0, window)
    got = attention_prefill_softcap(q, kc, vc, blocks, torch.tensor([0, s], dtype=torch.int32), lens, 0.3, window, 2.0)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    got = attention_decode_softcap(q[-1:], kc, vc, blocks, lens, 0.3, window, 2.0)
    torch.testing.assert_close(got, want[-1:], rtol=1e-5, atol=1e-5)


def test_gelu_tanh_and_mul_is_hf_gelu_pytorch_tanh():
    from transformers.activations import ACT2FN

    x = torch.randn(5, 2 * 24, generator=torch.Generator().manual_seed(4)) * 3
    torch.testing.assert_close(gelu_tanh_and_mul(x), ACT2FN["gelu_pytorch_tanh"](x[:, :24]) * x[:, 24:])
