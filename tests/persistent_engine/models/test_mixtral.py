"""Mixtral (MixtralForCausalLM) against Hugging Face transformers' own modeling_mixtral.py, the public code the
family follows: a tiny model with random weights, loaded through tkcc's checkpoint names (block_sparse_moe,
experts.{j}.w1/w3/w2), gives HF's logits, with and without a sliding window; the router equals a dense
all-experts sum under the top-2 mask."""

import pytest
import torch

from persistent_engine.models.spec import ModelSpec
from persistent_engine.ops.moe import moe_experts, moe_route

hf = pytest.importorskip("transformers.models.mixtral.modeling_mixtral")
from transformers import MixtralConfig  # noqa: E402


def tiny_config(**kw) -> dict:
    cfg = dict(architectures=["MixtralForCausalLM"], model_type="mixtral", vocab_size=96, hidden_size=32,
               intermediate_size=24, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               num_local_experts=4, num_experts_per_tok=2, rms_norm_eps=1e-5, rope_theta=10000.0,
               max_position_embeddings=64, sliding_window=None, router_jitter_noise=0.0, tie_word_embeddings=False)
    cfg.update(kw)
    return cfg


def randomize(model, seed: int):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (p.shape[-1] ** -0.5 if p.dim() > 1 else 0.2) + (p.dim() == 1))
    return model


def checkpoint_names(state: dict[str, torch.Tensor], inter: int) -> dict[str, torch.Tensor]:
    """HF v5's in-memory layout (mlp.experts.gate_up_proj [E, 2I, H]) back to the published checkpoint's
    (block_sparse_moe.experts.{j}.w1 / w3 / w2), the inverse of transformers' conversion_mapping for mixtral."""
    out = {}
    for k, v in state.items():
        if ".mlp.experts.gate_up_proj" in k:
            base = k.replace(".mlp.experts.gate_up_proj", ".block_sparse_moe.experts.")
            for j in range(v.shape[0]):
                out[f"{base}{j}.w1.weight"], out[f"{base}{j}.w3.weight"] = v[j, :inter], v[j, inter:]
        elif ".mlp.experts.down_proj" in k:
            base = k.replace(".mlp.experts.down_proj", ".block_sparse_moe.experts.")
            for j in range(v.shape[0]):
                out[f"{base}{j}.w2.weight"] = v[j]
        else:
            out[k.replace(".mlp.gate.", ".block_sparse_moe.gate.")] = v
    return out




@pytest.mark.parametrize("window", [None, 5])
def test_mixtral_matches_hf(window, tkcc_last_logits):
    cfg = tiny_config(sliding_window=window)
    model = randomize(hf.MixtralForCausalLM(MixtralConfig(**cfg)).eval(), seed=1)
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model(ids).logits[:, -1]
    spec = ModelSpec.from_config(cfg, name="mixtral-test")
    assert spec.family == "mixtral" and spec.layer_windows == ((window,) * 2 if window else ())
    got = tkcc_last_logits(spec, checkpoint_names(model.state_dict(), cfg["intermediate_size"]), ids)
    torch.testing.assert_close(got, want, rtol=2e-4, atol=2e-4)


def test_mixtral_routing_is_a_masked_dense_mixture():
    """softmax over all experts, top-2, renormalised (MixtralTopKRouter): the routed sum equals a dense sum of every
    expert's output weighted by softmax(logits) masked to the top 2 and renormalised."""
    g = torch.Generator().manual_seed(3)
    t, e, h, inter = 7, 8, 16, 12
    x, logits = torch.randn(t, h, generator=g), torch.randn(t, e, generator=g)
    w13, w2 = torch.randn(e, 2 * inter, h, generator=g) * h ** -0.5, torch.randn(e, h, inter, generator=g) * inter ** -0.5
    weights, ids = moe_route(logits, None, 2, "softmax", 1, 1, True, 1.0)
    got = moe_experts(x, w13, w2, weights, ids)
    p = torch.softmax(logits, -1)
    mask = p >= p.sort(-1, descending=True).values[:, 1:2]                 # the two largest of each row
    dense_w = torch.where(mask, p, 0.0) / torch.where(mask, p, 0.0).sum(-1, keepdim=True)
    gate_up = torch.einsum("th,eih->tei", x, w13)
    act = torch.nn.functional.silu(gate_up[..., :inter]) * gate_up[..., inter:]
    want = torch.einsum("te,tei,ehi->th", dense_w, act, w2)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
