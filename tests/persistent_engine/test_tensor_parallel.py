"""Tensor/expert-parallel shards: pure sharding arithmetic in-process, and the sharded forward on 2 and
4 gloo ranks (spawned CPU processes on 127.0.0.1) against the single-process float32 reference."""

import os

import pytest
import torch

from persistent_engine.models.decoder import build_model
from persistent_engine.models.spec import ModelSpec
from persistent_engine.parallel import (SAFE_ENV, ParallelConfig, ParallelError, build_sharded, check_sharded,
                                        check_supported, kv_head_range, shard_params)


def test_shards_reassemble_the_full_weights():
    spec = ModelSpec.from_name("tiny-moe")
    full = build_model(spec, dtype=torch.float32, seed=3).params
    cfg = ParallelConfig(tp=2, ep=2)
    shards = [shard_params(spec, cfg, r, full) for r in range(2)]
    layer = spec.covering_layers()
    dense, moe = (f"layers.{i}." for i in layer)
    # row-parallel projections: columns concatenate back to the full matrix
    assert torch.equal(torch.cat([s[dense + "o_w"] for s in shards], dim=1), full[dense + "o_w"])
    assert torch.equal(torch.cat([s[dense + "down_w"] for s in shards], dim=1), full[dense + "down_w"])
    # EP: each rank holds half the experts, all of their width
    assert torch.equal(torch.cat([s[moe + "w13"] for s in shards]), full[moe + "w13"])
    assert shards[0][moe + "w2"].shape == (spec.num_experts // 2, spec.hidden_size, spec.moe_intermediate_size)
    # vocab-parallel lm_head, router replicated
    assert torch.equal(torch.cat([s["lm_head"] for s in shards]), full["lm_head"])
    assert shards[1][moe + "router_w"] is full[moe + "router_w"]


def test_gate_up_split_keeps_gate_and_up_paired():
    spec = ModelSpec.from_name("tiny-dense")
    full = build_model(spec, dtype=torch.float32).params["layers.0.gate_up_w"]
    i = spec.intermediate_size
    part = shard_params(spec, ParallelConfig(tp=2), 1, build_model(spec, dtype=torch.float32).params)
    got = part["layers.0.gate_up_w"]
    assert torch.equal(got[: i // 2], full[i // 2: i]) and torch.equal(got[i // 2:], full[i + i // 2:])


def test_kv_heads_replicate_beyond_num_kv_heads():
    spec = ModelSpec.from_name("tiny-dense")                    # 4 query heads, 2 KV heads
    assert [kv_head_range(spec, ParallelConfig(tp=2), r) for r in range(2)] == [(0, 1), (1, 2)]
    # tp=4: query heads 0,1 use KV head 0; 2,3 use KV head 1
    assert [kv_head_range(spec, ParallelConfig(tp=4), r) for r in range(4)] == [(0, 1), (0, 1), (1, 2), (1, 2)]


def test_build_sharded_matches_sharding_the_reference():
    spec = ModelSpec.from_name("tiny-moe")
    cfg = ParallelConfig(tp=2, ep=1)
    direct = build_sharded(spec, cfg, 1, dtype=torch.float32, seed=5)
    via = shard_params(spec, cfg, 1, build_model(spec, dtype=torch.float32, seed=5).params)
    assert set(direct.params) == set(via)
    assert all(torch.equal(direct.params[k], via[k]) for k in via)


@pytest.mark.parametrize("spec_name,cfg,why", [
    ("tiny-mla", ParallelConfig(tp=2), "MLA"),
    ("tiny-dense", ParallelConfig(tp=3), "query heads"),
    ("tiny-moe", ParallelConfig(tp=4, ep=4), None),
])
def test_unsupported_layouts_fail_with_one_line(spec_name, cfg, why):
    spec = ModelSpec.from_name(spec_name)
    if why is None:
        check_supported(spec, cfg)
        return
    with pytest.raises(ParallelError, match=why):
        check_supported(spec, cfg)


def test_ep_must_divide_tp():
    with pytest.raises(ParallelError):
        ParallelConfig(tp=4, ep=3)


def _assert_rows(rows, world, cases):
    assert len(rows) == world * len(cases) * 2                      # every rank, case and point reported
    for r in rows:
        assert r["ok"], r
        assert r["max_ref"] > 0.5                                   # logits are not trivially zero
    # the shards really are smaller than the reference (4 + 2 * 2 KV heads of 16 rows: 128)
    assert {r["qkv_rows"] for r in rows} == {(4 // world + 2 * max(1, 2 // world)) * 16}


@pytest.mark.timeout(120)
def test_sharded_forward_matches_reference_on_2_gloo_ranks():
    cases = [("tiny-dense", 2, 1), ("tiny-moe", 2, 2), ("tiny-moe", 2, 1)]
    _assert_rows(check_sharded(2, cases), 2, cases)
    assert os.environ["NCCL_NVLS_ENABLE"] == SAFE_ENV["NCCL_NVLS_ENABLE"] == "0"


@pytest.mark.timeout(120)
def test_sharded_forward_matches_reference_on_4_gloo_ranks():
    cases = [("tiny-dense", 4, 1), ("tiny-moe", 4, 4)]            # KV heads replicated; 2 experts per rank
    _assert_rows(check_sharded(4, cases), 4, cases)


@pytest.mark.gpu
@pytest.mark.timeout(600)
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_sharded_forward_matches_reference_on_2_nccl_gpus():
    """NCCL on two GPUs: the tiny models in fp32, then real-dimension slices (llama-8b layers 0-1 at TP 2,
    qwen3-moe layers 0-1 at EP 2) in fp32, each rank's full logits against its own single-GPU reference."""
    tiny = [("tiny-dense", 2, 1), ("tiny-moe", 2, 2)]
    _assert_rows(check_sharded(2, tiny, device="cuda"), 2, tiny)
    real = [("llama-8b", 2, 1, [0, 1]), ("qwen3-moe", 2, 2, [0, 1])]
    rows = check_sharded(2, real, device="cuda", timeout_s=540)
    assert len(rows) == 2 * len(real) * 2
    for r in rows:
        assert r["ok"] and r["max_ref"] > 0.1, r
    assert os.environ["NCCL_NVLS_ENABLE"] == "0"


def test_a_failing_rank_is_reported_in_one_line():
    with pytest.raises(ParallelError, match="cannot shard"):
        check_sharded(2, [("tiny-mla", 2, 1)])
