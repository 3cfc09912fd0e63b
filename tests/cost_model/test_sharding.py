"""A layout that says it fits must fit: every catalogue model x every GPU of hardware.json x every layout
the search enumerates (both frameworks), checked against the spec's own parameter counts, the label,
and the serving flags parsed back (cost_model.sharding.parse_flags: vLLM and SGLang are not installed
here, so the parser is ours, written from their argument definitions)."""

from __future__ import annotations

import json
import math
import re
from functools import lru_cache

import pytest

from cost_model.hardware import get_hardware
from cost_model.layout import ACT_BYTES, Layout, max_batch, memory_fit, weight_bytes_gpu
from cost_model.search import enumerate_layouts
from cost_model.sharding import FRAMEWORKS, expressible, parse_flags, serving_flags
from persistent_engine.models.aliases import ALIASES
from persistent_engine.models.spec import ModelSpec

HW = sorted(json.loads((__import__("pathlib").Path(__file__).parents[2] / "cost_model" / "hardware.json")
                       .read_text())["devices"])
MODELS = sorted({f: a for a, f in sorted(ALIASES.items(), reverse=True)}.values())   # one alias per config file
CONTEXT = 1280


@lru_cache(maxsize=None)
def spec_of(alias: str):
    return ModelSpec.from_name(alias)


def parse_label(label: str) -> dict:
    """``tp2-dp36-etp72 bf16`` -> its numbers; ep / etp defaults as the label documents them."""
    par, dtype = label.split(" ")
    got = {k: int(v) for k, v in re.findall(r"(etp|tp|dp|ep|pp|dcp)(\d+)", par)}
    tp, dp, ep = got["tp"], got.get("dp", 1), got.get("ep", 1)
    etp = got.get("etp", 1 if ep > 1 else tp)
    return {"tp": tp, "dp": dp, "ep": ep, "etp": etp, "pp": got.get("pp", 1), "dcp": got.get("dcp", 1), "dtype": dtype}


@lru_cache(maxsize=None)
def param_classes(alias: str) -> dict:
    """The spec's parameters per weight class, summed over its layers (SpecSizes' own counts)."""
    spec, h = spec_of(alias), spec_of(alias).hidden_size
    out = dict.fromkeys(("attention", "dense", "experts", "shared", "replicated"), 0)
    for i in range(spec.num_layers):
        kind = spec.layer_kind(i)
        mlp = spec.dense_mlp_params() if kind == "dense" else spec.moe_params()[0]
        out["attention"] += spec.layer_params(i)[0] - mlp
        if kind == "dense":
            out["dense"] += mlp
            continue
        experts = spec.num_experts * 3 * (spec.latent_moe_size or h) * spec.moe_intermediate_size
        shared = 3 * h * spec.shared_intermediate_size * spec.num_shared_experts
        out["experts"] += experts
        out["shared"] += shared
        out["replicated"] += mlp - experts - shared
    out["total"] = spec.total_params()
    return out


def class_lower_bound(spec, L: Layout) -> float:
    """Weight bytes per GPU the label's sharding allows at least: each class's bytes (from the spec's
    own parameter counts) / its sharding, all layers and both vocab tables spread over pp stages."""
    sh, wb, p = L.sharding, L.wbytes, param_classes(alias_of(spec))
    lab = parse_label(L.label())
    # MXFP4 checkpoints (gpt-oss) keep their routed experts at 4.25 bits (e2m1 + an e8m0 scale per 32)
    expert_b = min(wb, 4.25 / 8) if getattr(spec, "expert_dtype", "bf16") == "mxfp4" else wb
    total = (p["attention"] / lab["tp"] + p["dense"] / sh.dense_mlp + p["shared"] / sh.shared
             + p["replicated"]) * wb + p["experts"] / (lab["ep"] * lab["etp"]) * expert_b
    table = spec.vocab_size * spec.hidden_size * ACT_BYTES
    total += table / sh.embedding + (0 if spec.tie_word_embeddings else table / sh.lm_head)
    return total / lab["pp"]


def alias_of(spec) -> str:
    return next(a for a in MODELS if spec_of(a) is spec)


@lru_cache(maxsize=None)
def kv_classes(alias: str, kv_dtype: str) -> tuple:
    """(per-token cache bytes of the attention layers, recurrent state bytes per sequence), whole model."""
    spec = spec_of(alias)
    tok = sum(spec.kv_bytes_per_token_layer(kv_dtype, layer=i) for i in range(spec.num_layers)
              if not spec.state_bytes_per_seq_layer(i))
    return tok, sum(spec.state_bytes_per_seq_layer(i) for i in range(spec.num_layers))


def check_layout(spec, L: Layout) -> None:
    lab = parse_label(L.label())
    assert (lab["tp"], lab["dp"], lab["ep"], lab["pp"], lab["dcp"]) == (L.tp, L.dp, L.ep, L.pp, L.dcp), L
    sh = L.sharding
    assert spec.num_heads % L.tp == 0 and L.tp % L.dcp == 0, L        # both frameworks split heads evenly
    if spec.is_moe:                 # the label's expert split is the memory's: ep * etp == tp * dp
        assert spec.num_experts % L.ep == 0 and (L.tp * L.dp) % L.ep == 0, L
        assert lab["ep"] * lab["etp"] == L.tp * L.dp == sh.experts * sh.expert_tp, L
    w = weight_bytes_gpu(spec, L)
    assert w >= class_lower_bound(spec, L) * (1 - 1e-9), (spec.name, L.label(), w)
    # nothing counts more than the whole model (1%: per-layer replicated remainders of MiMo's mixed layers)
    assert w <= 1.01 * param_classes(alias_of(spec))["total"] * max(L.wbytes, ACT_BYTES), (spec.name, L.label())
    flags = serving_flags(L)
    assert flags is not None and expressible(L) is None, L
    assert parse_flags(L.framework, flags, L.dtype) == L, (L, flags)
    for fw in FRAMEWORKS:           # the other framework: its flags launch the same parallel layout, or a reason
        other = serving_flags(L, fw)
        if other is None:
            assert expressible(L, fw)
        else:
            back = parse_flags(fw, other, L.dtype)
            assert (back.tp, back.dp, back.ep, back.pp, back.dcp, back.kv_dtype) == \
                (L.tp, L.dp, L.ep, L.pp, L.dcp, L.kv_dtype), (fw, L, other)


def check_fit(spec, hw, L: Layout) -> None:
    """The largest batch reported as fitting leaves room for the KV it assumes, counted from the spec."""
    b = max_batch(spec, hw, L, CONTEXT)
    if b == 0:
        return
    m = memory_fit(spec, hw, L, b, CONTEXT)
    assert m.fits and m.total <= hw.usable_bytes
    per_gpu_seqs = math.ceil(b / L.dp) * L.pp
    # attention layers' per-token cache / its sharding (GQA heads tp, MLA latent dcp, V4 whole), recurrent state / tp
    tok, state = kv_classes(alias_of(spec), L.kv_dtype)
    split = {"mla": L.sharding.kv, "gqa": L.tp}.get(spec.attention, 1)
    kv_min = CONTEXT * tok / split + state / L.tp
    assert m.weights + m.activations + m.comm_buffers + per_gpu_seqs * kv_min / L.pp <= hw.usable_bytes * (1 + 1e-9)
    assert m.kv >= per_gpu_seqs * kv_min / L.pp * (1 - 1e-9), (spec.name, L.label())


@pytest.mark.parametrize("alias", MODELS)
def test_every_enumerated_layout_agrees(alias):
    spec = spec_of(alias)
    seen = set()
    for name in HW:
        hw = get_hardware(name)
        for gpus in sorted({8, hw.domain}):
            for fw in FRAMEWORKS:
                layouts = enumerate_layouts(spec, hw, gpus, kv_dtypes=("bf16", "fp8"), framework=fw)
                assert layouts or not spec.is_moe or gpus < 8, (alias, name, gpus, fw)
                for L in layouts:
                    assert gpus % L.gpus == 0
                    if L not in seen:
                        seen.add(L)
                        check_layout(spec, L)
                    check_fit(spec, hw, L)
    assert seen


def test_kimi_k3_nvl72_best_label_and_memory_agree():
    from cost_model.search import search

    spec, hw = spec_of("kimi"), get_hardware("gb200")
    r = search(spec, hw, 72)
    assert r.best is not None
    L = r.best.layout
    lab = parse_label(L.label())
    # the label says how the experts are split, and the memory counts exactly that split
    assert lab["ep"] * lab["etp"] == L.tp * L.dp
    experts = sum(1 for i in range(spec.num_layers) if spec.layer_kind(i) != "dense") * \
        spec.num_experts * 3 * spec.latent_moe_size * spec.moe_intermediate_size * L.wbytes
    assert r.best.memory.weights >= experts / (lab["ep"] * lab["etp"]) + spec.vocab_size * spec.hidden_size * 2 / L.tp
    assert r.best.memory.weights >= class_lower_bound(spec, L)
    assert r.best.memory.fits and r.best.memory.total <= hw.usable_bytes
    d = r.best.to_dict()
    assert d["label"] == L.label() and d["moe_tp"] == lab["etp"] if lab["ep"] == 1 else True
    vllm = d["serving"]["vllm"]["flags"]
    assert parse_flags("vllm", vllm, L.dtype) == L
    assert ("--enable-expert-parallel" in vllm) == (L.ep > 1)
    # the reading: 2.8 TB per GPU would be tp2 with the experts not split over the DP groups
    assert r.best.memory.weights < spec.total_params() * L.wbytes / L.tp / 10


def aiconfigurator_moe_weights(spec, tp: int, dp: int, ep: int, wb: float) -> float:
    """AIConfigurator's weight bytes per GPU for its MoE (Qwen3-MoE) model under vLLM, copied from
    ai-dynamo/aiconfigurator (Apache-2.0): sdk/backends/base_backend.py ``_get_memory_usage`` sums
    ``op.get_weights()`` over the context ops of sdk/models/moe.py (embedding vocab / tp, qkv and proj
    GEMMs, the bf16 router GEMM of sdk/models/blocks/moe.py) with the MoE op's weights from
    rust/.../operators/moe.rs: floor(floor(3 H I E bytes / moe_ep) / moe_tp); GEMM weights n k bytes.
    Its context graph has no lm_head."""
    h, moe_tp = spec.hidden_size, tp * dp // ep
    hk = (spec.num_kv_heads + tp - 1) // tp
    qkv = (spec.num_heads * spec.head_dim // tp + spec.head_dim * hk * 2) * h * wb
    proj = h * (spec.num_heads * spec.head_dim // tp) * wb
    experts = math.floor(math.floor(h * spec.moe_intermediate_size * spec.num_experts * wb * 3 / ep) / moe_tp)
    return (spec.vocab_size // tp) * h * 2 + spec.num_layers * (qkv + proj + spec.num_experts * h * 2 + experts)


@pytest.mark.parametrize("tp,dp,ep,dtype", [(1, 1, 1, "bf16"), (2, 1, 1, "bf16"), (8, 1, 1, "bf16"), (4, 1, 1, "fp8"),
                                             (1, 8, 8, "bf16"), (2, 4, 8, "fp8"), (2, 4, 1, "bf16")])
def test_weights_match_aiconfigurator(tp, dp, ep, dtype):
    """Where AIConfigurator's memory model covers a layout (Qwen3-30B-A3B: GQA attention, routed experts,
    no shared experts or dense layers; pp 1), ours less the lm_head it leaves out is within 0.1% of it
    (the remainder: our norms)."""
    spec = spec_of("qwen3-moe")
    L = Layout(tp=tp, dp=dp, ep=ep, dtype=dtype)
    ours = weight_bytes_gpu(spec, L) - spec.vocab_size * spec.hidden_size * ACT_BYTES / L.sharding.lm_head
    theirs = aiconfigurator_moe_weights(spec, tp, dp, ep, L.wbytes)
    assert theirs <= ours <= theirs * 1.001


def test_sharding_table_is_the_frameworks():
    """The table as read from vLLM's and SGLang's source (cost_model/sharding.py's docstring)."""
    vllm = Layout(tp=2, dp=36).sharding
    assert (vllm.attention, vllm.dense_mlp, vllm.experts, vllm.expert_tp, vllm.shared, vllm.embedding,
            vllm.lm_head) == (2, 2, 1, 72, 2, 2, 2)
    ep = Layout(tp=2, dp=4, ep=8).sharding                  # sequence-parallel MoE: shared experts whole
    assert (ep.experts, ep.expert_tp, ep.shared) == (8, 1, 1)
    sg = Layout(tp=2, dp=4, ep=4, framework="sglang").sharding
    assert (sg.attention, sg.dense_mlp, sg.experts, sg.expert_tp, sg.shared, sg.embedding, sg.lm_head) == \
        (2, 8, 4, 2, 8, 1, 8)
    assert Layout(tp=2, dp=36).label() == "tp2-dp36-etp72 bf16"
    assert Layout(tp=1, dp=64, ep=64, dtype="fp8").label() == "tp1-dp64-ep64 fp8"
    assert Layout(tp=2, dp=4, ep=4, framework="sglang").label() == "tp2-dp4-ep4-etp2 bf16"
    assert Layout(tp=8).label() == "tp8 bf16"
    assert serving_flags(Layout(tp=2, dp=4, ep=4, framework="sglang"), "vllm") is None
    assert serving_flags(Layout(tp=8, dcp=4), "sglang") is None
    assert serving_flags(Layout(tp=2, dp=4, ep=4, framework="sglang")) == [
        "--tp-size", "8", "--dp-size", "4", "--enable-dp-attention", "--ep-size", "4"]
    assert parse_flags("vllm", ["-tp", "2", "--data-parallel-size=36", "--enable-expert-parallel"]) == \
        Layout(tp=2, dp=36, ep=72)
    for fw, bad in (("sglang", ["--tp-size", "8", "--dp-size", "4"]), ("vllm", ["--tensor-parallel-size"]),
                    ("vllm", ["--tp-size", "2"]), ("sglang", ["--kv-cache-dtype", "int3"])):
        with pytest.raises(ValueError):
            parse_flags(fw, bad)
