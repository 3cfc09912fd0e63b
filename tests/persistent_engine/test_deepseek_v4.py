"""DeepSeek-V4's reference forward at toy size (no transformers needed): causal across every layer kind (a
longer sequence leaves the earlier logits unchanged, compressed entries included), slices keep each layer's
kind, and the hyper-connection streams matter."""

import json
import pathlib

import torch

from persistent_engine.models.deepseek_v4 import V4Config, forward, init_weights

CONFIG = pathlib.Path(__file__).parents[2] / "persistent_engine" / "models" / "configs" / "deepseek-v4-flash.json"


def _tiny():
    c = json.loads(CONFIG.read_text())
    c.update(hidden_size=32, num_attention_heads=2, head_dim=16, qk_rope_head_dim=4, q_lora_rank=16, o_groups=2,
             o_lora_rank=8, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, index_n_heads=2,
             index_head_dim=8, index_topk=2, sliding_window=6, vocab_size=64, num_hidden_layers=5,
             compress_ratios=[0, 0, 4, 8, 4], num_hash_layers=2)
    return c, V4Config.from_hf(c)


def test_forward_is_causal_across_window_csa_and_hca_layers():
    c, cfg = _tiny()
    w = init_weights(c, list(range(5)), dtype=torch.float32, seed=1)
    ids = torch.randint(0, 64, (41,), generator=torch.Generator().manual_seed(2))
    full = forward(cfg, w, ids)
    for n in (7, 16, 33):                    # before / after windows close at 4 and 8 tokens
        torch.testing.assert_close(forward(cfg, w, ids[:n]), full[:n], rtol=1e-4, atol=1e-4)
    later = ids.clone()
    later[30:] = (later[30:] + 1) % 64
    torch.testing.assert_close(forward(cfg, w, later)[:30], full[:30], rtol=1e-4, atol=1e-4)
    assert not torch.allclose(forward(cfg, w, later)[30:], full[30:], atol=1e-3)


def test_slices_and_streams():
    c, cfg = _tiny()
    w = init_weights(c, [2, 3], dtype=torch.float32, seed=3)
    ids = torch.randint(0, 64, (20,), generator=torch.Generator().manual_seed(4))
    both = forward(cfg, w, ids, [2, 3])
    assert both.shape == (20, 64) and torch.isfinite(both).all()
    assert not torch.allclose(both, forward(cfg, w, ids, [2]), atol=1e-3)
    one_stream = V4Config.from_hf({**c, "hc_mult": 1})
    w1 = init_weights({**c, "hc_mult": 1}, [2, 3], dtype=torch.float32, seed=3)
    assert forward(one_stream, w1, ids, [2, 3]).shape == (20, 64)
