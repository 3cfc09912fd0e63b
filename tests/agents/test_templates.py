"""Every template of the library honours its op's contract (persistent_engine.ops.contract) on the
registry's small example shapes: Triton templates under TRITON_INTERPRET=1 (set by conftest), two knob
settings each (the default and a small-block one that exercises masks, loops and split paths)."""

import ast
import importlib.util

import pytest
import torch

from agents.templates import (TEMPLATES, Choice, TemplateError, dims_of, get_template, load_candidate,
                              render_candidate, templates_for)
from agents.templates.base import KERNEL_DIR
from persistent_engine.models.spec import ModelSpec
from persistent_engine.ops import registry
from persistent_engine.ops.contract import check_op

# small blocks so that the example shapes take the multi-block, masked and split-K/split-KV paths
SMALL = {
    "rms_norm.triton_rows": {"RMSN_BLOCK_D": 64, "RMSN_ROWS": 2, "RMSN_NUM_WARPS": 1},
    "fused_add_rms_norm.triton_rows": {"FARN_BLOCK_D": 64, "FARN_ROWS": 4, "FARN_NUM_WARPS": 1},
    "silu_and_mul.triton": {"SAM_BLOCK_I": 64, "SAM_NUM_WARPS": 1},
    "rotary_embedding.triton": {"ROPE_HEADS": 1, "ROPE_NUM_WARPS": 1},
    "linear.triton_gemv_splitk": {"GEMV_BLOCK_N": 8, "GEMV_BLOCK_K": 64, "GEMV_BLOCK_M": 2, "GEMV_SPLIT_K": 2,
                                  "GEMV_NUM_WARPS": 1, "GEMV_NUM_STAGES": 1, "GEMV_MAX_M": 64, "GEMV_PDL": 1,
                                  "GEMV_FUSED_REDUCE": 1},
    "linear.triton_tiled": {"TILE_BLOCK_M": 16, "TILE_BLOCK_N": 32, "TILE_BLOCK_K": 32, "TILE_SPLIT_K": 2,
                            "TILE_GROUP_M": 4, "TILE_NUM_WARPS": 2, "TILE_NUM_STAGES": 2},
    # 16-row tiles: the 17/33-row examples take several row blocks (W reused from L2), split-K with the fused reduce
    "linear.triton_skinny": {"SKINNY_BLOCK_T": 16, "SKINNY_BLOCK_N": 32, "SKINNY_BLOCK_K": 32, "SKINNY_SPLIT_K": 2,
                             "SKINNY_NUM_WARPS": 4, "SKINNY_NUM_STAGES": 2, "SKINNY_MAX_M": 64,
                             "SKINNY_FUSED_REDUCE": 1},
    "attention_decode.triton_splitkv": {"ATTD_BLOCK_T": 16, "ATTD_NUM_SPLITS": 4, "ATTD_NUM_WARPS": 1,
                                        "ATTD_NUM_STAGES": 1, "ATTD_DOT": True, "ATTD_PDL": 1},
    # one program (the interpreter runs programs in turn: a grid barrier with more would wait forever); 2 batch rows
    # a unit: the 3-row example ends in a partial block; 8-row GEMV blocks and 32-wide chunks end in masked tails
    "dense_gqa_decode_layer.triton_persistent": {"DLAY_PROGRAMS": 132, "DLAY_BLOCK_N": 8, "DLAY_BLOCK_K": 32,
                                                 "DLAY_BLOCK_B": 2, "DLAY_SPLITS": 2, "DLAY_BLOCK_T": 16,
                                                 "DLAY_NUM_WARPS": 2},
    # the whole step in one launch (the default is one launch a layer)
    "dense_gqa_decode_step.triton_persistent": {"DSTP_PROGRAMS": 132, "DSTP_BLOCK_N": 8, "DSTP_BLOCK_K": 32,
                                                "DSTP_BLOCK_B": 1, "DSTP_SPLITS": 4, "DSTP_BLOCK_T": 16,
                                                "DSTP_NUM_WARPS": 2, "DSTP_ONE_LAUNCH": 1},
    # 2 rows a program: the 7- and 5-token examples end in a partial program; the grouped one takes the torch path
    "moe_route.triton": {"MROUTE_ROWS": 2, "MROUTE_NUM_WARPS": 2},
    # BLOCK_Q 4: the examples' 5- and 7-query chunks take two blocks each (one partial), the group padded to 4 rows
    "attention_prefill.triton_varlen": {"ATTP_BLOCK_Q": 4, "ATTP_BLOCK_T": 16, "ATTP_NUM_WARPS": 1,
                                        "ATTP_NUM_STAGES": 1},
    # *_PDL 1: the GEMV's peeled first tile (programmatic dependent launch itself needs an SM90 GPU), with
    # *_FUSED_REDUCE 1 where split-K: the reduce in the GEMV's last-arriving programs
    # composite ops: MAX_T 4 sends the T=5/7 examples through the tl.dot path, the rest through split-K
    "add_rms_norm_linear.triton_fused": {"ARNL_BLOCK_N": 4, "ARNL_BLOCK_K": 64, "ARNL_BLOCK_M": 2, "ARNL_SPLIT_K": 2,
                                         "ARNL_NUM_WARPS": 1, "ARNL_NUM_STAGES": 1, "ARNL_MAX_T": 4, "ARNL_TILED": 1,
                                         "ARNL_TILE_M": 16, "ARNL_TILE_N": 32, "ARNL_TILE_K": 32,
                                         "ARNL_TILE_WARPS": 2, "ARNL_TILE_STAGES": 2, "ARNL_PDL": 1,
                                         "ARNL_FUSED_REDUCE": 1},
    "silu_mul_linear.triton_fused": {"SML_BLOCK_N": 4, "SML_BLOCK_K": 64, "SML_BLOCK_M": 1, "SML_SPLIT_K": 4,
                                     "SML_NUM_WARPS": 1, "SML_NUM_STAGES": 1, "SML_MAX_T": 4, "SML_TILED": 1,
                                     "SML_TILE_M": 16, "SML_TILE_N": 32, "SML_TILE_K": 32,
                                     "SML_TILE_WARPS": 2, "SML_TILE_STAGES": 2, "SML_PDL": 1,
                                     "SML_FUSED_REDUCE": 1},
    # MAX_T 4: T=5 takes the torch path; T=3 split-K 2 with BLOCK_M 2; 4 heads per reduce program straddle q/k/v
    "add_rms_norm_qkv_rotary.triton_fused": {"QKVR_BLOCK_N": 4, "QKVR_BLOCK_K": 64, "QKVR_BLOCK_M": 2,
                                             "QKVR_SPLIT_K": 2, "QKVR_NUM_WARPS": 1, "QKVR_NUM_STAGES": 1,
                                             "QKVR_MAX_T": 4, "QKVR_HEADS": 4, "QKVR_REDUCE_WARPS": 1, "QKVR_PDL": 1},
    # the region op's examples (T 3 and 1): MAX_T 1 sends T=3 through the torch composition + index_copy_
    "add_rms_norm_qkv_rotary_kv_write.triton_fused": {"QKVW_BLOCK_N": 4, "QKVW_BLOCK_K": 64, "QKVW_BLOCK_M": 1,
                                                      "QKVW_SPLIT_K": 2, "QKVW_NUM_WARPS": 1, "QKVW_NUM_STAGES": 1,
                                                      "QKVW_MAX_T": 1, "QKVW_HEADS": 4, "QKVW_REDUCE_WARPS": 1,
                                                      "QKVW_PDL": 1},
    "attention_decode_window.triton": {"ATTW_BLOCK_T": 8, "ATTW_NUM_WARPS": 4, "ATTW_NUM_STAGES": 1},
    "gated_delta_decode.triton": {"GDD_BLOCK_V": 16, "GDD_NUM_WARPS": 1},      # Dv 20: two blocks, a masked tail
    "swigluoai_and_mul.triton": {"SOAI_BLOCK_I": 64, "SOAI_NUM_WARPS": 1},
    "hc_post.triton": {"HCP_BLOCK_D": 16, "HCP_NUM_WARPS": 1},
    "hc_pre.triton": {"HCPR_SPLIT_K": 2, "HCPR_BLOCK_K": 32, "HCPR_BLOCK_T": 2, "HCPR_NUM_WARPS": 1,
                      "HCPR_BLOCK_D": 16, "HCPR_COLLAPSE_WARPS": 1},
    "swiglu_clamp_and_mul.triton": {"SWCL_BLOCK_I": 64, "SWCL_NUM_WARPS": 1},
    "sparse_mla_decode.triton": {"SMLA_BLOCK_H": 16, "SMLA_BLOCK_K": 16, "SMLA_NUM_WARPS": 2, "SMLA_NUM_STAGES": 1},
    "compressed_attention.triton": {"CSAA_BLOCK_H": 16, "CSAA_BLOCK_T": 16, "CSAA_BLOCK_E": 16, "CSAA_NUM_WARPS": 8,
                                    "CSAA_NUM_STAGES": 1, "CSAA_SPLITS": 2},
    "moe_experts_situ.triton_fused": {"MOES_GEMV_MAX_PAIRS": 8, "MOES_GEMV_ROWS": 4, "MOES_GEMV_BLOCK_K": 32,
                                      "MOES_GEMV_WARPS": 1, "MOES_BLOCK_M": 16, "MOES_BLOCK_N": 16, "MOES_BLOCK_K": 16,
                                      "MOES_GROUP_M": 4, "MOES_NUM_WARPS": 2, "MOES_NUM_STAGES": 1},
    "kda_decode.triton": {"KDA_BLOCK_V": 8, "KDA_NUM_WARPS": 1},
    "situ_and_mul.triton": {"SITU_BLOCK_I": 64, "SITU_NUM_WARPS": 1},
    "gelu_tanh_and_mul.triton": {"GELU_BLOCK_I": 64, "GELU_NUM_WARPS": 1},
    "moe_experts.triton_fused": {"MOE_GEMV_MAX_PAIRS": 8, "MOE_GEMV_ROWS": 4, "MOE_GEMV_BLOCK_K": 32,
                                 "MOE_GEMV_WARPS": 1, "MOE_BLOCK_M": 16, "MOE_BLOCK_N": 16, "MOE_BLOCK_K": 16,
                                 "MOE_GROUP_M": 4, "MOE_NUM_WARPS": 2, "MOE_NUM_STAGES": 1},
    "moe_experts_clamp.triton_fused": {"MOEC_GEMV_MAX_PAIRS": 8, "MOEC_GEMV_ROWS": 4, "MOEC_GEMV_BLOCK_K": 32,
                                       "MOEC_GEMV_WARPS": 1, "MOEC_BLOCK_M": 16, "MOEC_BLOCK_N": 16, "MOEC_BLOCK_K": 16,
                                       "MOEC_GROUP_M": 4, "MOEC_NUM_WARPS": 2, "MOEC_NUM_STAGES": 1},
}


def _impl(template, knobs):
    ns = load_candidate(render_candidate([Choice(template, knobs)]))
    return ns["OVERRIDES"][template.op]


def _settings(t):
    out = [t.default()]
    if t.name in SMALL:
        out.append(SMALL[t.name])
    else:   # torch templates: every value of their one implementation knob
        out = [{k.name: v for k in t.knobs} for k in t.knobs for v in k.values]
    return out


@pytest.mark.parametrize("name", [t.name for t in TEMPLATES if t.backend == "triton"])
def test_triton_template_passes_contract(name):
    t = get_template(name)
    assert name in SMALL, "add a small knob setting for every Triton template"
    default, small = _settings(t)
    for knobs, dtypes in ((default, (torch.float32, torch.bfloat16)), (small, (torch.bfloat16,))):
        assert t.check(knobs) == [], knobs
        assert check_op(t.op, _impl(t, knobs), dtypes=dtypes) == [], (name, knobs)


@pytest.mark.parametrize("name", [t.name for t in TEMPLATES if t.backend == "torch"])
def test_torch_template_passes_contract(name):
    t = get_template(name)
    for knobs in _settings(t):
        assert check_op(t.op, _impl(t, knobs)) == [], (name, knobs)


def test_rendered_candidate_is_self_contained_and_composes():
    """All templates in one file: parses, imports only what a candidate may, no name collisions,
    knob values inlined, one override per op."""
    by_op = {}
    for t in TEMPLATES:
        by_op.setdefault(t.op, t)
    choices = [Choice(t, t.default()) for t in by_op.values()]
    source = render_candidate(choices, config={"max_num_seqs": 8}, description="all ops")
    tree = ast.parse(source)
    imports = {ast.unparse(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))}
    assert imports == {"import math", "import torch", "import triton", "import triton.language as tl"}
    assert "import agents" not in source and "persistent_engine" not in source
    names = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    names += [tgt.id for n in tree.body if isinstance(n, ast.Assign) for tgt in n.targets
              if isinstance(tgt, ast.Name)]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    ns = load_candidate(source)
    assert set(ns["OVERRIDES"]) == set(by_op)
    assert ns["CONFIG"] == {"max_num_seqs": 8} and ns["DESCRIPTION"] == "all ops"
    # a knob value is rewritten in place
    gemv = get_template("linear.triton_gemv_splitk")
    src = render_candidate([Choice(gemv, {**gemv.default(), "GEMV_SPLIT_K": 8})])
    assert "\nGEMV_SPLIT_K = 8\n" in src and src.count("GEMV_SPLIT_K = ") == 1
    # templates of one file (the fused MoE's three epilogues): its section once, each template's knobs set
    moe, clamp = get_template("moe_experts.triton_fused"), get_template("moe_experts_clamp.triton_fused")
    src = render_candidate([Choice(moe, {**moe.default(), "MOE_BLOCK_M": 32}),
                            Choice(clamp, {**clamp.default(), "MOEC_BLOCK_M": 64})])
    assert src.count("def _moe_fused(") == 1 and "\nMOE_BLOCK_M = 32\n" in src and "\nMOEC_BLOCK_M = 64\n" in src
    assert set(load_candidate(src)["OVERRIDES"]) == {"moe_experts", "moe_experts_clamp"}


def test_validity_checks():
    gemv = get_template("linear.triton_gemv_splitk")
    bad = {**gemv.default(), "GEMV_BLOCK_N": 64, "GEMV_BLOCK_K": 1024, "GEMV_BLOCK_M": 4, "GEMV_NUM_WARPS": 1}
    assert any("per thread" in r for r in gemv.check(bad))
    assert any("not in" in r for r in gemv.check({**gemv.default(), "GEMV_SPLIT_K": 3}))
    assert any("missing" in r for r in gemv.check({}))
    with pytest.raises(TemplateError):
        render_candidate([Choice(gemv, bad)])
    rms = get_template("rms_norm.triton_rows")
    tiny = dims_of(ModelSpec.from_name("tiny-dense"))
    assert rms.check({**rms.default(), "RMSN_BLOCK_D": 64}, tiny) == []
    assert any("twice the row" in r for r in rms.check({**rms.default(), "RMSN_BLOCK_D": 1024}, tiny))
    with pytest.raises(TemplateError):
        get_template("no_such.template")
    with pytest.raises(TemplateError):   # two overrides of one op
        render_candidate([Choice(rms, rms.default()), Choice(get_template("rms_norm.torch_fused"),
                                                              {"TRMS_IMPL": "fused"})])


def test_library_covers_the_issue_ops_on_both_devices():
    cuda_ops = {t.op for t in templates_for(device="cuda")}
    assert {"rms_norm", "fused_add_rms_norm", "silu_and_mul", "rotary_embedding", "linear",
            "attention_decode", "moe_experts"} <= cuda_ops
    cpu_ops = {t.op for t in templates_for(device="cpu")}
    assert {"rms_norm", "silu_and_mul", "linear", "attention_decode"} <= cpu_ops
    assert all(t.backend == "torch" for t in templates_for(device="cpu"))


def test_attention_auto_splits_fill_the_gpu_and_match_the_reference():
    """ATTD_NUM_SPLITS = 0 (the default): ~2 programs per SM, a power of 2, never more slices than
    BLOCK_T tiles; on a simulated 132-SM GPU a batch-1 1k-token context splits 32 ways (one tile per
    slice, several of them empty for shorter sequences) and still matches the reference."""
    from persistent_engine.ops.attention import attention_decode
    t = get_template("attention_decode.triton_splitkv")
    assert t.default()["ATTD_NUM_SPLITS"] == 0
    ns = load_candidate(render_candidate([Choice(t, t.default())]))
    q1 = torch.zeros(1, 32, 64)
    ns["_SMS"][q1.device] = 132
    assert [ns["_attd_splits"](q1, b, 8, 1024) for b in (1, 4, 32, 64)] == [32, 16, 2, 1]
    assert ns["_attd_splits"](q1, 1, 8, 64) == 2           # 2 tiles of 32 tokens
    torch.manual_seed(0)
    B, Hq, Hk, D, page, mb = 2, 8, 2, 64, 16, 8
    q = torch.randn(B, Hq, D)
    kc, vc = torch.randn(B * mb, page, Hk, D), torch.randn(B * mb, page, Hk, D)
    bt = torch.randperm(B * mb, dtype=torch.int32).view(B, mb)
    cl = torch.tensor([100, 7], dtype=torch.int32)
    ns["_SMS"][q.device] = 132                             # cdiv(264, 4) -> 4 tiles of 32: 4 slices
    out = ns["attention_decode_triton"](q, kc, vc, bt, cl, 0.125)
    torch.testing.assert_close(out, attention_decode(q, kc, vc, bt, cl, 0.125), atol=2e-5, rtol=1e-4)


def _mixed_batch(chunks, ctx, Hq, Hk, D, page, dtype, device, seed=3):
    """attention_prefill's arguments for a serving step of sequences with ``chunks[b]`` queries each (1: a decode)
    and ``ctx[b]`` cached tokens after them, over a shuffled page pool."""
    g = torch.Generator().manual_seed(seed)
    mb, nb = max(-(-c // page) for c in ctx), len(ctx) * max(-(-c // page) for c in ctx) + 2
    q = torch.randn(sum(chunks), Hq, D, generator=g)
    kc, vc = torch.randn(nb, page, Hk, D, generator=g), torch.randn(nb, page, Hk, D, generator=g)
    bt = torch.randperm(nb, generator=g)[:len(ctx) * mb].to(torch.int32).view(len(ctx), mb)
    cu = torch.tensor([0, *torch.tensor(chunks).cumsum(0).tolist()], dtype=torch.int32)
    return (q.to(device, dtype), kc.to(device, dtype), vc.to(device, dtype), bt.to(device), cu.to(device),
            torch.tensor(ctx, dtype=torch.int32, device=device), D ** -0.5)


@pytest.mark.parametrize("block_q", [16, 4])
def test_varlen_prefill_attention_serves_a_mixed_batch(block_q):
    """attention_prefill.triton_varlen on what a mixed serving step holds: a fresh prompt chunk, a chunk over a
    cached prefix and three decodes (one-query chunks), GQA group 4, ragged contexts over shuffled pages. It
    matches the reference op and, independently, per-sequence SDPA with the causal offset of the cached prefix."""
    from persistent_engine.ops.attention import attention_prefill, gather_pages
    t = get_template("attention_prefill.triton_varlen")
    fn = _impl(t, {**t.default(), "ATTP_BLOCK_Q": block_q, "ATTP_BLOCK_T": 16})
    chunks, ctx, Hq, Hk = [37, 9, 1, 1, 1], [37, 59, 1, 20, 70], 8, 2
    q, kc, vc, bt, cu, cl, scale = args = _mixed_batch(chunks, ctx, Hq, Hk, 32, 16, torch.float32, "cpu")
    out = fn(*args)
    torch.testing.assert_close(out, attention_prefill(*args), atol=2e-5, rtol=1e-4)
    for b, (n, c) in enumerate(zip(chunks, ctx)):
        k = gather_pages(kc, bt[b:b + 1])[0, :c].repeat_interleave(Hq // Hk, dim=1).transpose(0, 1)   # [Hq, c, D]
        v = gather_pages(vc, bt[b:b + 1])[0, :c].repeat_interleave(Hq // Hk, dim=1).transpose(0, 1)
        allowed = torch.arange(c)[None, :] <= (c - n + torch.arange(n))[:, None]                      # [n, c]
        want = torch.nn.functional.scaled_dot_product_attention(q[cu[b]:cu[b + 1]].transpose(0, 1), k, v,
                                                                attn_mask=allowed, scale=scale)
        torch.testing.assert_close(out[cu[b]:cu[b + 1]], want.transpose(0, 1), atol=2e-5, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("model", ["llama-1b", "qwen3-moe"])
def test_cuda_varlen_prefill_attention_at_serving_shapes(model):
    """On a GPU in bf16 at the model's heads: a 512-token chunk over a 1k prefix, a fresh 300-token prompt and 32
    decodes at 1-2k contexts in one call, within the op's bf16 tolerance of the fp32 reference."""
    from persistent_engine.ops.contract import compare_outputs
    spec = ModelSpec.from_name(model)
    t = get_template("attention_prefill.triton_varlen")
    assert t.check(t.default(), dims_of(spec)) == []
    fn, d = _impl(t, t.default()), registry.get("attention_prefill")
    chunks = [512, 300] + [1] * 32
    ctx = [1536, 300] + [1024 + 31 * i for i in range(32)]
    args = _mixed_batch(chunks, ctx, spec.num_heads, spec.num_kv_heads, spec.head_dim, 16, torch.bfloat16, "cuda")
    ref = d.reference(*(a.float() if torch.is_tensor(a) and a.is_floating_point() else a for a in args))
    assert compare_outputs((fn(*args),), (ref,), *d.tolerance(torch.bfloat16)) == []


@pytest.mark.parametrize("model", ["qwen3-moe", "glm", "kimi"])
def test_moe_route_template_at_the_models_routing_matches_the_reference(model):
    """moe_route.triton at a model's own routing (qwen3-moe: 128 experts, top-8 softmax; GLM: 256, top-8 sigmoid
    with the correction bias; Kimi: 896 experts, top-16) for 1, 3 and 17 tokens, 4 rows a program: the op's
    contract (weights within tolerance, the same experts)."""
    spec = ModelSpec.from_name(model)
    t = get_template("moe_route.triton")
    knobs = {**t.default(), "MROUTE_ROWS": 4, "MROUTE_NUM_WARPS": 4}
    assert t.check(knobs, dims_of(spec)) == []
    shapes = [{"T": n, "E": spec.num_experts, "k": spec.num_experts_per_tok, "scoring": spec.scoring,
               "bias": spec.routing_bias, "norm": spec.norm_topk_prob, "scale": spec.routed_scaling_factor}
              for n in (1, 3, 17)]
    assert check_op("moe_route", _impl(t, knobs), dtypes=(torch.float32,), shapes=shapes) == []


@pytest.mark.gpu
def test_cuda_moe_route_in_a_graph_matches_at_qwen3_moe_routing():
    """On a GPU, captured in a CUDA graph as the serving engine replays it: qwen3-moe's routing at 1, 16 and 64
    tokens within the op's contract."""
    from cuda_graph_support import eager_and_replayed
    spec = ModelSpec.from_name("qwen3-moe")
    t = get_template("moe_route.triton")
    fn, d = _impl(t, t.default()), registry.get("moe_route")
    for n in (1, 16, 64):
        args = d.make_inputs({"T": n, "E": spec.num_experts, "k": spec.num_experts_per_tok, "scoring": spec.scoring,
                              "norm": spec.norm_topk_prob}, torch.float32, "cuda", 0)
        eager, replayed = eager_and_replayed(lambda: fn(*args))
        assert all(torch.equal(a, b) for a, b in zip(eager, replayed)), n
        assert check_op("moe_route", fn, dtypes=(torch.float32,), shapes=[{"T": n, "E": spec.num_experts,
                        "k": spec.num_experts_per_tok, "scoring": spec.scoring}], device="cuda") == [], n


_LAYER_ON_GPU = """
import sys, torch
from cuda_graph_support import eager_and_replayed
from test_templates import _impl
from agents.templates import dims_of, get_template
from persistent_engine.models.spec import ModelSpec
from persistent_engine.ops import registry
from persistent_engine.ops.contract import check_op
spec, t = ModelSpec.from_name("llama-1b"), get_template("dense_gqa_decode_layer.triton_persistent")
assert t.check(t.default(), dims_of(spec)) == []
fn, d = _impl(t, t.default()), registry.get(t.op)
for b in (1, 4, 16):
    shape = {"B": b, "ctx": 1024, "H": spec.hidden_size, "Hq": spec.num_heads, "Hk": spec.num_kv_heads,
             "Dh": spec.head_dim, "R": spec.head_dim, "I": spec.intermediate_size, "bias": False, "BS": 16}
    args = d.make_inputs(shape, torch.bfloat16, "cuda", 0)
    eager, replayed = eager_and_replayed(lambda: fn(*args))       # the counter zeroed by each launch
    assert all(torch.equal(a, r) for a, r in zip(eager, replayed)), b
    problems = check_op(t.op, fn, dtypes=(torch.bfloat16,), shapes=[shape], device="cuda")
    assert problems == [], (b, problems)
step = get_template("dense_gqa_decode_step.triton_persistent")
for one in (1, 0):                  # the whole step in one launch; one launch a layer
    fn = _impl(step, {**step.default(), "DSTP_ONE_LAUNCH": one})
    shape = {**shape, "B": 1, "L": 3, "V": spec.vocab_size}
    args = registry.get(step.op).make_inputs(shape, torch.bfloat16, "cuda", 0)
    eager, replayed = eager_and_replayed(lambda: fn(*args))
    assert torch.equal(eager, replayed), one
    problems = check_op(step.op, fn, dtypes=(torch.bfloat16,), device="cuda", shapes=[shape])
    assert problems == [], (one, problems)
print("ok")
"""


@pytest.mark.gpu
def test_cuda_persistent_layer_at_llama_1b_matches_and_never_hangs():
    """On a GPU: the persistent layer kernel at llama-1b's layer (batch 1, 4, 16, context 1024, bf16) within the
    region's tolerance of the reference (K/V writes included), and a CUDA-graph replay bitwise the eager call (the
    barrier counter is zero again after every launch); the step template over three such layers and the lm_head,
    in one launch and in one a layer.
    Run in a child process under a deadline: a grid barrier whose programs are not all resident waits forever."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    tests = Path(__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests.parents[1]), str(tests)])}
    try:
        done = subprocess.run([sys.executable, "-c", _LAYER_ON_GPU], env=env, capture_output=True, text=True,
                              timeout=240, cwd=tests)
    except subprocess.TimeoutExpired:
        pytest.fail("the persistent layer kernel did not finish in 240 s (a grid barrier waiting forever?)")
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_the_one_launch_step_ping_pongs_its_residual_over_an_odd_layer_count():
    """dense_gqa_decode_step in one persistent launch at three layers with a qkv bias and three sequences: the
    residual alternates between two buffers a layer (the last layer's is in the second), the address table
    gives each layer its own weights and caches."""
    t = get_template("dense_gqa_decode_step.triton_persistent")
    knobs = {**t.default(), "DSTP_BLOCK_N": 8, "DSTP_BLOCK_K": 32, "DSTP_NUM_WARPS": 2, "DSTP_ONE_LAUNCH": 1}
    shape = {**registry.get(t.op).examples[0], "B": 3, "L": 3, "bias": True}
    assert check_op(t.op, _impl(t, knobs), dtypes=(torch.float32,), shapes=[shape]) == []


def test_prepacked_lm_head_repacks_a_weight_written_in_place():
    """The packed-weight cache of lm_head.torch_prepacked: the same tensor is packed once, an in-place
    write repacks it, at most TLMH_CACHED weights are held, and the logits equal the reference's bits."""
    from persistent_engine.ops.basic import lm_head

    t = get_template("lm_head.torch_prepacked")
    ns = load_candidate(render_candidate([Choice(t, t.default())]))
    fn, cache = ns["OVERRIDES"]["lm_head"], ns["TLMH_PACKED"]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 64, generator=g).bfloat16()
    w = torch.randn(500, 64, generator=g).bfloat16()
    assert torch.equal(fn(x, w), lm_head(x, w)) and fn(x, w).dtype == torch.float32
    packed = next(iter(cache.values()))[3]
    fn(x, w)
    assert next(iter(cache.values()))[3] is packed                  # packed once for this tensor
    w.mul_(2)
    assert torch.equal(fn(x, w), lm_head(x, w))                     # repacked after the write
    others = [torch.randn(500, 64, generator=g).bfloat16() for _ in range(3)]
    for o in others:
        assert torch.equal(fn(x, o), lm_head(x, o))
    assert len(cache) == ns["TLMH_CACHED"]
    assert torch.equal(fn(x.float(), w.float()), lm_head(x.float(), w.float()))   # other dtypes: the reference


def test_a_shared_kernel_file_is_inlined_once_and_template_files_still_import():
    """The linear family's kernels (shared_gemv.py) stand once in a candidate that holds two of its templates,
    after the sections that call them, and only those its templates need; a template file itself still imports
    and names them."""
    arnl, sml = get_template("add_rms_norm_linear.triton_fused"), get_template("silu_mul_linear.triton_fused")
    src = render_candidate([Choice(arnl, arnl.default()), Choice(sml, sml.default())])
    assert src.count("def _sg_gemv(") == 1 and src.count("def _sg_reduce(") == 1
    assert src.index("def silu_mul_linear_triton(") < src.index("def _sg_gemv(")
    assert "from agents" not in src and "import agents" not in src
    gemv = get_template("linear.triton_gemv_splitk")            # no tiled GEMM: not called by the GEMV template
    only = render_candidate([Choice(gemv, gemv.default())])
    assert "def _sg_gemv(" in only and "def _sg_tiled(" not in only and "def _sg_gemm(" not in only
    spec = importlib.util.spec_from_file_location("gemv_file", KERNEL_DIR / "triton_linear_gemv.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.linear_gemv.__globals__["_sg_decode"].__name__ == "_sg_decode"


def test_a_header_imports_only_shared_files_and_a_candidate_takes_what_it_calls(tmp_path, monkeypatch):
    """A shared file's functions that a template names (and what they call) are inlined, the rest not; a header
    that imports from a file which is itself not shared (it imports a shared one) is refused."""
    from agents.templates import base
    (tmp_path / "shared_x.py").write_text("import triton\n# ---- section ----\ndef _x_one():\n    return 1\n\n\n"
                                          "def _x_two():\n    return _x_one() + 1\n\n\ndef _x_unused():\n    return 0\n")
    (tmp_path / "t.py").write_text("from agents.templates.kernels.shared_x import _x_two\n# ---- section ----\n"
                                   "T_K = 1\n\n\ndef t_entry():\n    return _x_two() + T_K\n")
    (tmp_path / "bad.py").write_text("from agents.templates.kernels.t import t_entry\n# ---- section ----\n")
    monkeypatch.setattr(base, "KERNEL_DIR", tmp_path)
    base._section.cache_clear()
    base._shared_text.cache_clear()
    try:
        t = base.Template("x.t", "x", "t.py", "t_entry", "torch", ("cpu",), (base.Knob("T_K", (1, 2)),), "test")
        src = render_candidate([Choice(t, {"T_K": 2})])
        assert load_candidate(src)["OVERRIDES"]["x"]() == 4 and "_x_unused" not in src
        with pytest.raises(TemplateError, match="not a shared kernel file"):
            base._section("bad.py")
    finally:
        base._section.cache_clear()
        base._shared_text.cache_clear()
