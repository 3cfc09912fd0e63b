"""A tiny Llama checkpoint and a plan of torch-source kernels for it, shared by the vLLM export tests.

The checkpoint: config.json + model.safetensors, random seeded fp32 weights, hidden 128, 2 heads of 64
(vLLM's CPU attention needs a head size of at least 32), 2 layers, vocabulary 256. The plan's model is
the checkpoint's config.json, so the shapes its kernels were verified on are the checkpoint's.
"""

from __future__ import annotations

import json
from pathlib import Path

from compiler.plan import artifact as plan_mod
from plan_samples import make_plan

HIDDEN, INTER, LAYERS, VOCAB, HEADS, KV_HEADS = 128, 256, 2, 256, 2, 1
TORCH_KERNELS = ("rms_norm.torch_fused", "fused_add_rms_norm.torch_fused", "silu_and_mul.torch_direct",
                 "rotary_embedding.torch_joint")


def write_checkpoint(d: Path) -> Path:
    import torch
    from safetensors.torch import save_file

    d.mkdir(parents=True, exist_ok=True)
    dh = HIDDEN // HEADS
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
           "intermediate_size": INTER, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
           "num_key_value_heads": KV_HEADS, "vocab_size": VOCAB, "max_position_embeddings": 256,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "torch_dtype": "float32", "tie_word_embeddings": False,
           "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2}
    (d / "config.json").write_text(json.dumps(cfg))
    g = torch.Generator().manual_seed(0)

    def r(*shape, scale=0.5):
        return (torch.randn(*shape, generator=g) * scale).contiguous()

    t = {"model.embed_tokens.weight": r(VOCAB, HIDDEN), "model.norm.weight": 1 + r(HIDDEN, scale=0.05),
         "lm_head.weight": r(VOCAB, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t |= {p + "input_layernorm.weight": 1 + r(HIDDEN, scale=0.05),
              p + "post_attention_layernorm.weight": 1 + r(HIDDEN, scale=0.05),
              p + "self_attn.q_proj.weight": r(HIDDEN, HIDDEN), p + "self_attn.k_proj.weight": r(KV_HEADS * dh, HIDDEN),
              p + "self_attn.v_proj.weight": r(KV_HEADS * dh, HIDDEN), p + "self_attn.o_proj.weight": r(HIDDEN, HIDDEN),
              p + "mlp.gate_proj.weight": r(INTER, HIDDEN), p + "mlp.up_proj.weight": r(INTER, HIDDEN),
              p + "mlp.down_proj.weight": r(HIDDEN, INTER)}
    save_file(t, str(d / "model.safetensors"))
    return d


def render(name: str) -> str:
    from agents.templates.base import Choice, render_candidate
    from agents.templates.library import get_template

    t = get_template(name)
    return render_candidate([Choice(t, t.default())])


def write_plan(root: Path, model: str, *, kernels: tuple[str, ...] = TORCH_KERNELS, extra: dict[str, str] | None = None,
               config: dict | None = None, best: dict | None = None) -> Path:
    """A plan of ``model`` whose optimizations are the ``kernels`` templates (one kernel file each), ``extra``
    (op -> source) and a config optimization with ``config``; ``best`` is its parallelism.best."""
    sources = {name.split(".")[0]: render(name) for name in kernels} | (extra or {})
    opts, files = [], {}
    for op, src in sources.items():
        rel = plan_mod.kernel_path(src, (op,))
        files[rel] = src
        opts.append(plan_mod.PlanOptimization(name=f"offline-0-{op}-1", targets=(op,), speedup={"fast": 1.2, "slow": 1.1},
                                          kernel=rel, author="offline-0", description=op))
    if config:
        src = f"OVERRIDES = {{}}\nCONFIG = {json.dumps(config)}\nDESCRIPTION = 'engine settings'\n"
        rel = plan_mod.kernel_path(src, ("config",))
        files[rel] = src
        opts.append(plan_mod.PlanOptimization(name="offline-config-1", targets=tuple(config), kernel=rel,
                                          speedup={"fast": 1.0, "slow": 1.0}, projected={"tokens_per_s": 1.0}))
    parallelism = {"configs": [], "best": best or {"tp": 1, "pp": 1, "ep": 1, "dp": 1, "dcp": 1, "dtype": "bf16",
                                                   "kv_dtype": "bf16", "batch": 16, "replicas": 1, "pd": "colocated"}}
    plan = make_plan(model=model, optimizations=tuple(opts), parallelism=parallelism)
    return plan_mod.write_version(root, plan, sources=files, composed_source=None, profile=None)
