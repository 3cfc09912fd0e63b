"""Regions as ops (ops/layers.py) and declared in-place outputs (OpDef.writes, contract.run_candidate): the
K/V-write composite, the dense GQA decode layer and decode step; the decoder's call sites; a candidate that
writes a wrong, an extra or no slot of the paged cache is rejected."""

import dataclasses
import importlib.util
import os
import pathlib

import pytest
import torch

from persistent_engine.verification import verify
from persistent_engine.models.decoder import Decoder, build_model
from persistent_engine.models.spec import ModelSpec
from persistent_engine.ops import layers, registry
from persistent_engine.ops.contract import check_op, run_candidate, written_rows
from persistent_engine.inputs.workloads import make_workload
from persistent_engine.io_struct import WorkloadPoint

KV = "add_rms_norm_qkv_rotary_kv_write"
LAYER, STEP = "dense_gqa_decode_layer", "dense_gqa_decode_step"
DECODE = WorkloadPoint("decode", 3, 20, 1, 1.0)
CANDIDATES = pathlib.Path(__file__).parent / "candidates"


def _candidate(name: str):
    spec = importlib.util.spec_from_file_location(name, CANDIDATES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _kv_write_with(write):
    """The K/V-write composite with its write replaced by ``write(rows, slots, values)``."""
    ref = registry.get("add_rms_norm_qkv_rotary").reference

    def impl(x, residual, norm_weight, eps, qkv_weight, qkv_bias, positions, cos_sin_cache, rotary_dim, num_heads,
             num_kv_heads, k_cache, v_cache, slot_mapping):
        q, k, v, r = ref(x, residual, norm_weight, eps, qkv_weight, qkv_bias, positions, cos_sin_cache, rotary_dim,
                         num_heads, num_kv_heads)
        write(k_cache.view(-1, *k.shape[1:]), slot_mapping, k)
        write(v_cache.view(-1, *v.shape[1:]), slot_mapping, v)
        return q, r
    return impl


def _put(rows, slots, values):
    rows[slots] = values


@pytest.mark.parametrize("name", [KV, LAYER])
def test_defaults_pass_the_contract_and_declare_the_cache_writes(name):
    d = registry.get(name)
    assert d.composite and d.region and [w.pool for w in d.writes] == ([11, 12] if name == KV else [3, 4])
    assert check_op(name, d.default) == []
    args = d.make_inputs(d.examples[0], torch.float32, "cpu", 3)
    before = [a.clone() for a in (args[d.writes[0].pool], args[d.writes[1].pool])]
    d.reference(*args)
    rows = written_rows(d, args)                                    # the new tokens' K and V rows
    assert len(rows) == 2 and all(r.shape[0] == d.examples[0].get("T", d.examples[0].get("B")) for r in rows)
    assert not torch.equal(before[0], args[d.writes[0].pool])       # the reference really writes its cache


def test_fused_kv_write_passes_and_wrong_extra_or_missing_slots_are_rejected():
    assert check_op(KV, _kv_write_with(_put), dtypes=(torch.float32,)) == []

    def wrong(rows, slots, values):
        rows[(slots + 1) % rows.shape[0]] = values

    def extra(rows, slots, values):
        rows[slots] = values
        rows[(slots[:1] + 1) % rows.shape[0]] = values[:1]

    def missing(rows, slots, values):
        rows[slots[1:]] = values[1:]                               # the first token's K/V never written

    for impl, why in ((wrong, "changed outside its declared slots"), (extra, "changed outside its declared slots"),
                      (missing, "non-finite")):
        reasons = check_op(KV, _kv_write_with(impl), dtypes=(torch.float32,))
        assert reasons and all(why in r for r in reasons), (impl.__name__, reasons)


def test_writing_another_argument_is_still_a_modified_input():
    def scribble(x, residual, *rest):
        out = _kv_write_with(_put)(x, residual, *rest)
        residual.add_(1)
        return out
    first, reason = run_candidate(registry.get(KV), scribble, registry.get(KV).examples[0], torch.float32, "cpu", 0)
    assert first is None and reason == "modified input: argument 1 changed"


def test_layer_candidates_whole_layer_passes_and_wrong_slot_is_rejected():
    assert check_op(LAYER, _candidate("layer_torch").dense_gqa_decode_layer) == []
    reasons = check_op(LAYER, _candidate("layer_wrong_slot").dense_gqa_decode_layer, dtypes=(torch.float32,))
    assert reasons and all("outside its declared slots" in r for r in reasons)


def test_step_region_checks_tuples_of_caches_and_weights():
    d = registry.get(STEP)
    shape = d.examples[0]
    assert check_op(STEP, d.default, dtypes=(torch.float32,), shapes=[shape]) == []

    def stale_second_layer(*args):       # the second layer's cache is written one row off
        out = d.reference(*args)
        kc = args[9][1]
        rows = kc.view(-1, *kc.shape[2:])
        rows[(args[2] + 1) % rows.shape[0]] = 0.0
        return out
    first, reason = run_candidate(d, stale_second_layer, shape, torch.float32, "cpu", 1)
    assert first is None and reason.startswith("modified input: argument 9[1] changed outside its declared slots")


def test_shapes_only_for_dense_gqa_models_at_decode_points():
    llama = ModelSpec.from_name("llama-1b")
    assert layers.dense_gqa(llama) and registry.get(LAYER).shapes(llama, DECODE)[0]["I"] == 8192
    assert registry.get(LAYER).shapes(llama, dataclasses.replace(DECODE, phase="prefill", chunk=8)) == []
    for alias in ("qwen3-moe", "tiny-moe", "tiny-mla", "glm"):
        assert not layers.dense_gqa(ModelSpec.from_name(alias))
        assert all(registry.get(n).shapes(ModelSpec.from_name(alias), DECODE) == [] for n in (KV, LAYER, STEP))


@pytest.fixture(scope="module")
def llama():
    return build_model(ModelSpec.from_name("llama-1b").scaled_down(), layers=2)


def test_decoder_runs_a_llama_decode_step_as_regions_bitwise_like_the_fine_path(llama, monkeypatch):
    wl = make_workload(llama, DECODE, seed=2)
    calls = {LAYER: 0, STEP: 0}

    def counting(name):
        base = registry.get(name).default

        def run(*args):
            calls[name] += 1
            return base(*args)
        return run
    with registry.override({n: counting(n) for n in calls}):
        regions = llama.step(wl)
    assert calls == {STEP: 1, LAYER: 2}
    monkeypatch.setattr(Decoder, "_region_weights", lambda self, wl: None)
    assert torch.equal(regions, llama.step(wl))                     # same ops, same order: same bits


def test_a_layer_override_replaces_every_layers_work(llama):
    wl = make_workload(llama, DECODE, seed=3)
    base = llama.step(wl)
    good = _candidate("layer_torch").dense_gqa_decode_layer
    seen = []
    with registry.override({LAYER: lambda *a: seen.append(a[3].data_ptr()) or good(*a),
                            "attention_decode": lambda *a: 1 / 0}):       # never reached: the layer is replaced
        out = llama.step(wl)
    assert len(set(seen)) == 2 and verify.compare_logits(out, base, llama.dtype, "layer", 5e-2) is None


def test_op_level_verification_checks_the_layer_at_the_workload_points(llama):
    spec, points = llama.spec, [DECODE, dataclasses.replace(DECODE, batch=1, context=7)]
    good = _candidate("layer_torch").dense_gqa_decode_layer
    [ok] = verify.op_level([LAYER], {LAYER: good}, spec, points, torch.device("cpu"), torch.bfloat16, seed=11)
    assert ok.passed, ok.detail
    bad = _candidate("layer_wrong_slot").dense_gqa_decode_layer
    [no] = verify.op_level([LAYER], {LAYER: bad}, spec, points, torch.device("cpu"), torch.bfloat16, seed=11)
    assert not no.passed and "'ctx': 21" in no.detail and "declared slots" in no.detail


def test_cache_rows_guard_names_a_pool_written_outside_the_new_tokens(llama):
    from persistent_engine.verification import guards

    wl = make_workload(llama, dataclasses.replace(DECODE, context=5), seed=4)      # the next row after each new token: masked
    rows = guards.CacheRows(wl)
    llama.step(wl)
    assert rows.changed() == []                                     # the default writes the new tokens' rows only
    sneaky = _candidate("layer_extra_row_in_model")
    assert check_op(LAYER, sneaky.dense_gqa_decode_layer) == []     # op-level inputs have spare blocks: unseen
    base = llama.step(wl)
    with registry.override({LAYER: sneaky.dense_gqa_decode_layer}):
        out = llama.step(wl)
    assert verify.compare_logits(out, base, llama.dtype, "layer", 5e-2) is None      # the logits cannot tell
    assert rows.changed() == [f"k[{i}]" for i in llama.layers]


def test_triton_rotary_and_kv_write_in_one_kernel_passes_and_reaches_the_model(llama):
    """kv_write_triton.py: one Triton kernel rotates q/k and writes K/V into their cache rows (TRITON_INTERPRET
    on CPU, tests/conftest.py): the contract holds, and inside the layer region's default it replaces the
    default's rotary and K/V writes on every layer with the same logits."""
    fused = _candidate("kv_write_triton").add_rms_norm_qkv_rotary_kv_write
    if os.environ.get("TRITON_INTERPRET") != "1":            # a GPU box: the compiled kernel, on the device
        assert torch.cuda.is_available(), "Triton on CPU tensors needs TRITON_INTERPRET=1"
        assert check_op(KV, fused, device="cuda") == []
        return
    assert check_op(KV, fused) == []
    wl = make_workload(llama, dataclasses.replace(DECODE, batch=2, context=9), seed=5)
    base = llama.step(wl)
    with registry.override({KV: fused, "rotary_embedding": lambda *a: 1 / 0}):
        out = llama.step(wl)
    assert verify.compare_logits(out, base, llama.dtype, "kv", 5e-2) is None
