"""gpt-oss: the Hub configs load (and a changed key is refused by name), MXFP4 decodes as a hand-computed table,
the tiny model equals a direct per-token re-implementation of HF transformers' GptOss equations (sinks, windows,
YaRN, biases, top-k softmax routing, the clamped SwiGLU), the biased-experts op equals a loop, and the cost model
counts MXFP4 experts at 4.25 bits."""

import json
import math

import pytest
import torch

from cost_model.layout import Layout, mlp_weight_bytes_gpu
from cost_model.ops import step_ops
from persistent_engine.io_struct import WorkloadPoint
from persistent_engine.models import build_model
from persistent_engine.ops.mxfp4 import decode_mxfp4, encode_mxfp4
from persistent_engine.models.spec import CONFIG_DIR, ModelSpec, SpecError
from persistent_engine.models.weights import hf_to_internal, internal_to_hf
from persistent_engine.ops.gpt_oss import moe_experts_bias
from persistent_engine.inputs.workloads import make_workload

F32 = torch.float32


def hub(name="gpt-oss-120b"):
    return json.loads((CONFIG_DIR / f"{name}.json").read_text())


# ----------------------------------------------------------------------------- config
def test_hub_configs_load_with_their_architecture():
    big, small = ModelSpec.from_name("gpt-oss"), ModelSpec.from_name("gpt-oss-20b")
    assert (big.family, big.num_layers, big.num_experts, small.num_layers, small.num_experts) == \
        ("gpt_oss", 36, 128, 24, 32)
    assert big.layer_windows[:4] == (128, 0, 128, 0) and big.attention_sinks and big.qkv_bias and big.o_bias
    assert big.moe_bias and big.mlp_act == "swigluoai" and (big.swiglu_alpha, big.swiglu_limit) == (1.702, 7.0)
    assert big.scoring == "softmax" and big.norm_topk_prob and big.expert_dtype == "mxfp4"
    assert big.rope_scaling["rope_type"] == "yarn" and big.rope_scaling["truncate"] is False
    # the published sizes: 116.8B / 20.9B parameters, 5.1B / 3.6B active (the model card counts the unembedding only)
    assert big.total_params() == pytest.approx(116.83e9, rel=1e-3)
    assert small.total_params() == pytest.approx(20.91e9, rel=1e-3)
    emb = big.vocab_size * big.hidden_size
    assert big.active_params() - emb == pytest.approx(5.13e9, rel=2e-3)
    assert small.active_params() - emb == pytest.approx(3.61e9, rel=2e-3)


@pytest.mark.parametrize("key,value", [
    ("quantization_config", {"quant_method": "fp8", "weight_block_size": [128, 128]}),
    ("quantization_config", {"quant_method": "mxfp4", "modules_to_not_convert": ["lm_head"]}),
    ("layer_types", ["chunked_attention", "full_attention"] * 18),
    ("hidden_act", "gelu"),
    ("experts_per_token", 2),
    ("initial_context_length", 8192),
    ("attention_bias", False),
    ("swiglu_beta", 2.0),
])
def test_a_changed_key_is_refused_by_name(key, value, tmp_path):
    cfg = {**hub(), key: value}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(SpecError) as e:
        ModelSpec.from_name(str(path))
    assert key in str(e.value) and "\n" not in str(e.value)


# ----------------------------------------------------------------------------- MXFP4
def test_mxfp4_decode_matches_a_hand_computed_table():
    # one row, two blocks of 32 values: block 0 scale 2^0 (byte 127), block 1 scale 2^-2 (byte 125)
    blocks = torch.zeros(1, 2, 16, dtype=torch.uint8)
    blocks[0, 0, :4] = torch.tensor([0x21, 0xF8, 0x7A, 0x53], dtype=torch.uint8)
    blocks[0, 1, :2] = torch.tensor([0x6E, 0x94], dtype=torch.uint8)
    scales = torch.tensor([[127, 125]], dtype=torch.uint8)
    out = decode_mxfp4(blocks, scales, F32)
    assert out.shape == (1, 64)
    # low nibble first: 0x21 -> 0.5, 1.0; 0xF8 -> -0.0, -6.0; 0x7A -> -1.0, 6.0; 0x53 -> 1.5, 3.0
    assert out[0, :8].tolist() == [0.5, 1.0, -0.0, -6.0, -1.0, 6.0, 1.5, 3.0]
    assert out[0, 8:32].abs().sum() == 0
    # times 2^-2: 0x6E -> -4.0, 4.0; 0x94 -> 2.0, -0.5
    assert out[0, 32:36].tolist() == [-1.0, 1.0, 0.5, -0.125]
    assert math.copysign(1.0, out[0, 2].item()) == -1.0            # code 8 is -0.0
    assert decode_mxfp4(blocks, torch.tensor([[128, 125]], dtype=torch.uint8), F32)[0, 3].item() == -12.0


def test_mxfp4_encode_rounds_to_the_nearest_code_and_round_trips():
    w = torch.tensor([[0.26, -0.74, 2.4, 2.6, 5.1, -7.5, 0.0, 3.0] * 4])        # max 7.5 -> scale 2^0
    blocks, scales = encode_mxfp4(w)
    assert scales.tolist() == [[127]]
    assert decode_mxfp4(blocks, scales, F32)[0, :8].tolist() == [0.5, -0.5, 2.0, 3.0, 6.0, -6.0, 0.0, 3.0]
    x = torch.randn(3, 7, 96)
    b, s = encode_mxfp4(x)
    d = decode_mxfp4(b, s, F32)
    b2, s2 = encode_mxfp4(d)                                       # decoded values are exactly representable
    assert torch.equal(b, b2) and torch.equal(s, s2)


def test_the_model_keeps_the_packs_and_runs_their_exact_decode():
    spec = ModelSpec.from_name("gpt-oss-20b+tiny")
    model = build_model(spec, layers=[0], dtype=torch.bfloat16)
    p = model.params
    assert p["layers.0.w13_blocks"].dtype == torch.uint8 and p["layers.0.w13_blocks"].shape == (16, 64, 2, 16)
    assert torch.equal(decode_mxfp4(p["layers.0.w13_blocks"], p["layers.0.w13_scales"]), p["layers.0.w13"])
    assert torch.equal(decode_mxfp4(p["layers.0.w2_blocks"], p["layers.0.w2_scales"]), p["layers.0.w2"])
    # HF names (interleaved gate/up packs) and back
    hf = internal_to_hf(spec, [0], p)
    assert hf["model.layers.0.mlp.experts.gate_up_proj_blocks"].shape == (16, 64, 2, 16)
    back = hf_to_internal(spec, [0], hf.__getitem__)
    assert all(torch.equal(back[k], v) for k, v in p.items() if k.startswith("layers.0."))


# ----------------------------------------------------------------------------- the layer, from HF's equations
def _rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _yarn(dim, base, sc):
    """HF _compute_yarn_parameters with truncate false: inv_freq and the attention factor."""
    factor, old = sc["factor"], sc["original_max_position_embeddings"]
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)

    def corr(rot):
        return dim * math.log(old / (rot * 2 * math.pi)) / (2 * math.log(base))
    low, high = max(corr(sc["beta_fast"]), 0), min(corr(sc["beta_slow"]), dim - 1)
    extrapolation = 1 - ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    inv = (1 / (factor * pos_freqs)) * (1 - extrapolation) + (1 / pos_freqs) * extrapolation
    return inv, 0.1 * math.log(factor) + 1


def _rotate(x, cos, sin):                           # HF gpt-oss _apply_rotary_emb: first half / second half
    a, b = x.chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def _hf_forward(spec, w, tokens, layers):
    """A per-token, per-head, per-expert re-implementation of GptOssModel's forward on HF-named weights."""
    t, d, hq, hk, eps = len(tokens), spec.head_dim, spec.num_heads, spec.num_kv_heads, spec.rms_norm_eps
    inv, mscale = _yarn(d, spec.rope_theta, spec.rope_scaling)
    ang = torch.arange(t, dtype=torch.float64)[:, None] * inv[None]
    cos, sin = (ang.cos() * mscale).float()[:, None], (ang.sin() * mscale).float()[:, None]
    x = w["model.embed_tokens.weight"][tokens]
    for i in layers:
        a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        h = _rms(x, w[f"model.layers.{i}.input_layernorm.weight"], eps)
        q, k, v = (h @ w[a + f"{n}_proj.weight"].T + w[a + f"{n}_proj.bias"] for n in "qkv")
        q, k, v = q.view(t, hq, d), k.view(t, hk, d), v.view(t, hk, d)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        window = spec.layer_window(i)
        o = torch.zeros(t, hq, d)
        for p in range(t):
            lo = max(0, p - window + 1) if window else 0
            for head in range(hq):
                g = head // (hq // hk)
                s = torch.stack([q[p, head] @ k[j, g] * d ** -0.5 for j in range(lo, p + 1)])
                probs = torch.softmax(torch.cat([s, w[a + "sinks"][head].view(1)]), dim=0)[:-1]
                o[p, head] = sum(probs[n] * v[lo + n, g] for n in range(len(probs)))
        x = x + o.reshape(t, hq * d) @ w[a + "o_proj.weight"].T + w[a + "o_proj.bias"]
        h = _rms(x, w[f"model.layers.{i}.post_attention_layernorm.weight"], eps)
        logits = h @ w[m + "router.weight"].T + w[m + "router.bias"]
        top = logits.topk(spec.num_experts_per_tok, dim=-1)
        weights = torch.softmax(top.values, dim=-1)
        out = torch.zeros_like(x)
        for p in range(t):
            for slot in range(spec.num_experts_per_tok):
                e = int(top.indices[p, slot])
                gu = h[p] @ w[m + "experts.gate_up_proj"][e] + w[m + "experts.gate_up_proj_bias"][e]
                gate, up = gu[::2].clamp(max=spec.swiglu_limit), gu[1::2].clamp(-spec.swiglu_limit, spec.swiglu_limit)
                glu = gate * torch.sigmoid(gate * spec.swiglu_alpha)
                y = ((up + 1) * glu) @ w[m + "experts.down_proj"][e] + w[m + "experts.down_proj_bias"][e]
                out[p] += weights[p, slot] * y
        x = x + out
    return _rms(x, w["model.norm.weight"], eps)


def test_tiny_gpt_oss_equals_a_direct_formulation_of_hf_gpt_oss():
    # bf16 experts in HF's unquantized layout (x @ W, gate/up interleaved); a window of 8 below the 12 tokens
    spec = ModelSpec.from_name("gpt-oss+tiny").replace(expert_dtype="bf16", quantization="none")
    assert spec.layer_windows == (0, 8) and spec.num_experts_per_tok == 4
    model = build_model(spec, dtype=F32, seed=3)
    with torch.no_grad():                          # sinks large enough to matter
        for i in model.layers:
            model.params[f"layers.{i}.sinks"].normal_(0.0, 2.0)
    wl = make_workload(model, WorkloadPoint(phase="prefill", batch=1, context=0, chunk=12))
    got = model.hidden(wl)
    hf = {k: v.float() for k, v in internal_to_hf(spec, model.layers, model.params).items()}
    assert hf["model.layers.0.mlp.experts.gate_up_proj"].shape == (16, 64, 64)
    want = _hf_forward(spec, hf, wl.token_ids.tolist(), model.layers)
    torch.testing.assert_close(got, want, rtol=2e-4, atol=2e-4)
    # the window, the sinks and the expert biases each change the answer
    unwindowed = build_model(spec.replace(layer_windows=()), dtype=F32, seed=3)
    for name, t in model.params.items():            # in place: the blocks hold these tensors
        unwindowed.params[name].copy_(t)
    assert not torch.allclose(unwindowed.hidden(wl), got, atol=1e-3)
    for name, change in (("sinks", lambda p: p["layers.1.sinks"].fill_(-30.0)),
                         ("w2_b", lambda p: p["layers.1.w2_b"].add_(1.0))):
        change(model.params)
        assert not torch.allclose(model.hidden(wl), got, atol=1e-3), name


def test_biased_experts_op_equals_a_loop_on_every_path():
    g = torch.Generator().manual_seed(0)
    e, h, i, k = 8, 32, 16, 2
    w13, w2 = torch.randn(e, 2 * i, h, generator=g) * 0.3, torch.randn(e, h, i, generator=g) * 0.3
    b13, b2 = torch.randn(e, 2 * i, generator=g), torch.randn(e, h, generator=g)
    for t in (1, 9):                                # 3 t k < E: gather; else sorted rows (a loop in float64)
        x = torch.randn(t, h, generator=g) * 3
        ids = torch.rand(t, e, generator=g).argsort(-1)[:, :k]
        wts = torch.rand(t, k, generator=g)
        for dt in (F32, torch.float64):
            args = [a.to(dt) for a in (x, w13, w2)]
            got = moe_experts_bias(*args, b13, b2, wts, ids, 1.702, 1.5)
            want = torch.zeros(t, h, dtype=torch.float64)
            for p in range(t):
                for s in range(k):
                    n = int(ids[p, s])
                    gu = x[p].double() @ w13[n].double().T + b13[n].double()
                    gate, up = gu[:i].clamp(max=1.5), gu[i:].clamp(-1.5, 1.5)
                    want[p] += wts[p, s] * (((up + 1) * gate * torch.sigmoid(1.702 * gate)) @ w2[n].double().T
                                            + b2[n].double())
            torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- cost model
def test_cost_model_counts_mxfp4_experts_at_4_25_bits():
    spec = ModelSpec.from_name("gpt-oss")
    h, im, e = 2880, 2880, 128
    per_expert = 3 * h * im
    bf16 = Layout()
    moe = mlp_weight_bytes_gpu(spec, bf16, "moe")
    # MXFP4 experts; their biases b13 [2I], b2 [H], the router [E, H] and its bias [E] at the checkpoint's bf16
    assert moe == pytest.approx(e * (per_expert * 4.25 / 8 + (2 * im + h) * 2) + (h * e + e) * 2)
    assert mlp_weight_bytes_gpu(spec, Layout(dtype="fp8"), "moe") == pytest.approx(moe)      # 4.25 bits < fp8
    unquant = spec.replace(expert_dtype="bf16")
    assert mlp_weight_bytes_gpu(unquant, bf16, "moe") == pytest.approx(e * (per_expert * 2 + (2 * im + h) * 2) + (h * e + e) * 2)
    # a batch-1 decode step: 4 experts touched per layer, 6 H I FLOPs each plus the biases
    ops = {o.name: o for o in step_ops(spec, bf16, WorkloadPoint(phase="decode", batch=1, context=1000))}
    moe_op = ops["moe_experts"]
    assert moe_op.count == 36
    assert moe_op.flops == pytest.approx(4 * (6 * h * im + 2 * im + h))
    assert moe_op.bytes == pytest.approx(4 * (per_expert * 4.25 / 8 + (2 * im + h) * 4) + 4 * (2 * h + 3 * im) * 2)
    # half the layers see at most 128 keys: the attention reads (128 + 1001) / 2 keys per layer on average
    att = [o for o in step_ops(spec, bf16, WorkloadPoint(phase="decode", batch=1, context=1000)) if o.cls == "attention"]
    dense = ModelSpec.from_name("gpt-oss").replace(layer_windows=())
    att_full = [o for o in step_ops(dense, bf16, WorkloadPoint(phase="decode", batch=1, context=1000))
                if o.cls == "attention"]
    kv = 8 * 64 * 2 * 2
    assert sum(o.bytes * o.count for o in att_full) - sum(o.bytes * o.count for o in att) == pytest.approx(
        36 * kv * (1001 - (128 + 1001) / 2), rel=0.02)


def test_yarn_without_truncation_is_hf_s_table_at_real_size():
    from persistent_engine.models.rope import cos_sin_cache

    spec = ModelSpec.from_name("gpt-oss")
    inv, mscale = _yarn(64, 150000.0, spec.rope_scaling)
    want = torch.cat([torch.cos(100 * inv), torch.sin(100 * inv)]) * mscale
    torch.testing.assert_close(cos_sin_cache(spec, max_pos=101)[100], want.float())
    rounded = cos_sin_cache(spec.replace(rope_scaling={**spec.rope_scaling, "truncate": True}), max_pos=101)
    assert not torch.allclose(rounded[100], want.float(), atol=1e-3)          # floor/ceil of the ramp bounds


def test_a_template_reading_only_the_mxfp4_packs_passes_the_contract_and_a_wrong_decode_fails():
    import importlib.util
    import pathlib

    from persistent_engine.ops.contract import check_op

    path = pathlib.Path(__file__).parents[1] / "compiler" / "candidates" / "gpt_oss_mxfp4_experts.py"
    spec = importlib.util.spec_from_file_location("gpt_oss_mxfp4_experts", path)
    cand = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cand)
    shapes = [{"T": 5, "E": 8, "k": 4, "H": 64, "I": 32, "mxfp4": True}, {"T": 2, "E": 16, "k": 2, "H": 32, "I": 16}]
    assert check_op("moe_experts_bias", cand.moe_experts_bias, shapes=shapes) == []

    def off_by_one_scale(x, w13, w2, b13, b2, wts, ids, alpha, limit, packs=None):
        packs = (packs[0], packs[1] + 1, packs[2], packs[3])          # every w13 value twice too large
        return cand.moe_experts_bias(x, w13, w2, b13, b2, wts, ids, alpha, limit, packs)
    assert check_op("moe_experts_bias", off_by_one_scale, shapes=shapes[:1])
