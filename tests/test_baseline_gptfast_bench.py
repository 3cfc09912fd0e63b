"""benchmarks/baseline_gptfast.py: the independent gpt-fast-style decoder, built from a tkcc Decoder's weights
and paged context, computes tkcc's reference logits (fp32, tight) for a Llama (tiny-dense: Llama-3 rope
scaling, GQA) and a Qwen3-MoE (a tiny config.json written here: QK-norm, softmax top-k experts, a dense
``mlp_only_layers`` layer), writes the step's K/V at ``input_pos``, and refuses families it does not implement."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from persistent_engine.io_struct import WorkloadPoint
from persistent_engine.models.aliases import ALIASES, CONFIG_DIR
from persistent_engine.models.decoder import build_model
from persistent_engine.inputs.workloads import make_workload

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("baseline_gptfast_under_test",
                                              ROOT / "benchmarks" / "baseline_gptfast.py")
gf = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = gf                  # dataclasses look their module up by name
spec.loader.exec_module(gf)


def tiny_qwen3_moe(tmp_path: Path) -> Path:
    """Qwen3-30B-A3B's config.json at toy size, layer 1 dense (``mlp_only_layers``)."""
    c = json.loads((CONFIG_DIR / ALIASES["qwen3-moe"]).read_text())
    c.update(head_dim=16, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_attention_heads=4,
             num_key_value_heads=2, num_experts=8, num_experts_per_tok=2, num_hidden_layers=3, vocab_size=256,
             max_position_embeddings=512, mlp_only_layers=[1])
    path = tmp_path / "qwen3tiny.json"
    path.write_text(json.dumps(c))
    return path


def both(config: Path, layers, batch: int, context: int, dtype=torch.float32):
    """(tkcc decoder, its workload, its reference logits, the baseline on its weights and context)."""
    model = build_model(str(config), layers=layers, dtype=dtype)
    wl = make_workload(model, WorkloadPoint(phase="decode", batch=batch, context=context), seed=3)
    ref = model.step(wl)
    base = gf.build_from_tkcc(gf.ModelArgs.from_name(config), model.params, model.layers, batch, context + 1)
    gf.load_paged_context(base, wl.cache.k, wl.cache.v, wl.cache.block_tables, context)
    with torch.no_grad():
        out = base(wl.token_ids.view(batch, 1), torch.tensor([context]))
    return model, wl, ref, base, out


def rel(out, ref) -> float:
    return float((out.float() - ref).norm() / ref.norm())


def test_llama_logits_equal_the_tkcc_reference_and_the_new_kv_lands_at_input_pos():
    model, wl, ref, base, out = both(CONFIG_DIR / ALIASES["tiny-dense"], None, batch=2, context=21)
    args = base.args
    assert args.rope_scaling is not None and dict(args.rope_scaling)["factor"] == 32.0 and args.tie_embeddings
    assert base.max_seq_length == 24                     # 22 rounded up to a multiple of 8, as gpt-fast does
    assert out.shape == ref.shape == (2, 256)
    assert rel(out, ref) < 1e-5 and torch.equal(out.argmax(-1), ref.argmax(-1))
    # the step's K/V: tkcc wrote them at its slots, the baseline at input_pos (K's head dim in rope pairs)
    pairs = gf._halves_to_pairs(args.head_dim)
    for layer, i in zip(base.layers, base.layer_ids):
        k_new = wl.cache.k[i].view(-1, args.n_local_heads, args.head_dim)[wl.slot_mapping]
        v_new = wl.cache.v[i].view(-1, args.n_local_heads, args.head_dim)[wl.slot_mapping]
        cache = layer.attention.kv_cache
        torch.testing.assert_close(cache.k_cache[:, :, 21], k_new[..., pairs], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(cache.v_cache[:, :, 21], v_new, rtol=1e-5, atol=1e-5)
        assert not cache.k_cache[:, :, 22:].any()           # padding past the step: zeros, masked out


def test_a_wrong_context_changes_the_logits():
    """The cached context matters: the same step over a zeroed cache is far from the reference."""
    model, wl, ref, base, out = both(CONFIG_DIR / ALIASES["tiny-dense"], None, batch=2, context=21)
    for layer in base.layers:
        layer.attention.kv_cache.k_cache.zero_()
    with torch.no_grad():
        wrong = base(wl.token_ids.view(2, 1), torch.tensor([21]))
    assert rel(wrong, ref) > 1e-2


def test_qwen3_moe_logits_equal_the_tkcc_reference(tmp_path):
    config = tiny_qwen3_moe(tmp_path)
    _, _, ref, base, out = both(config, None, batch=4, context=30)
    kinds = [type(b.feed_forward).__name__ for b in base.layers]
    assert kinds == ["MOEFeedForward", "FeedForward", "MOEFeedForward"] and base.args.qk_norm
    assert rel(out, ref) < 1e-5 and torch.equal(out.argmax(-1), ref.argmax(-1))
    # a slice keeps each layer's original index (layer 2 alone is an MoE layer)
    _, _, ref, base, out = both(config, [2], batch=3, context=9)
    assert base.layer_ids == (2,) and type(base.layers[0].feed_forward).__name__ == "MOEFeedForward"
    assert rel(out, ref) < 1e-5


def test_bf16_stays_within_the_engine_bound(tmp_path):
    _, _, ref, _, out = both(tiny_qwen3_moe(tmp_path), [0, 1], batch=4, context=30, dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16 and rel(out, ref) < 5e-2


def test_families_it_does_not_implement_are_refused():
    for alias in ("tiny-moe", "tiny-mla"):                      # GLM-4.x MoE, DeepSeek-V3 MLA
        with pytest.raises(gf.Unsupported, match="model_type"):
            gf.ModelArgs.from_name(CONFIG_DIR / ALIASES[alias])
    with pytest.raises(gf.Unsupported, match="cannot read config"):
        gf.ModelArgs.from_name("/nonexistent/config.json")
    c = json.loads((CONFIG_DIR / ALIASES["tiny-dense"]).read_text())
    c["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}
    with pytest.raises(gf.Unsupported, match="yarn"):
        gf.ModelArgs.from_hf_config(c, "x")


@pytest.mark.slow
def test_the_compiled_step_is_one_graph_and_equals_eager(tmp_path):
    """compile_decode (fullgraph=True: a graph break fails) on CPU, dense and MoE layers; ~60 s on 2 cores."""
    _, wl, ref, base, out = both(tiny_qwen3_moe(tmp_path), None, batch=2, context=12)
    step = gf.compile_decode(base)
    with torch.no_grad():
        compiled = step(wl.token_ids.view(2, 1), torch.tensor([12]))
    assert rel(compiled, ref) < 1e-5


def test_it_imports_only_torch_and_the_standard_library():
    """Independent of tkcc's code: no project package (persistent_engine, compiler, ...) is imported."""
    import ast

    tree = ast.parse((ROOT / "benchmarks" / "baseline_gptfast.py").read_text())
    roots = {(n.module if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
             for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    assert roots <= {"__future__", "json", "math", "dataclasses", "pathlib", "torch"}, roots


def test_compile_decode_takes_both_modes_and_refuses_others():
    """reduce-overhead (CPU: inductor's default mode) and max-autotune-no-cudagraphs, the two baselines of
    e2e_decode.py; torch.compile is lazy, so nothing compiles here."""
    model, *_ = both(CONFIG_DIR / ALIASES["tiny-dense"], None, batch=1, context=4)[3:4]
    for mode in gf.MODES:
        assert callable(gf.compile_decode(model, mode))
    with pytest.raises(ValueError, match="compile mode 'max-autotune'"):
        gf.compile_decode(model, "max-autotune")
