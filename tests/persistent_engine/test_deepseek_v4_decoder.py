"""DeepSeek-V4 over the paged cache (models/deepseek_v4_decoder.py) against the whole-sequence reference
(models/deepseek_v4.py, itself matched to transformers' DeepseekV4ForCausalLM in test_dsv4_vs_hf.py): the
reference pools every window of the sequence at once and attends without a cache, the decoder closes
windows step by step from cached source rows; both at deepseek+tiny (window, CSA and HCA layers, hash and
top-k routing, 4 streams)."""

import pytest
import torch

from persistent_engine.models.deepseek_v4 import forward
from persistent_engine.models.decoder import build_model
from persistent_engine.models.spec import ModelSpec, SpecError
from persistent_engine.inputs.workloads import make_workload
from persistent_engine.io_struct import WorkloadPoint

TOL = dict(rtol=2e-4, atol=2e-4)


@pytest.fixture(scope="module")
def model():
    return build_model("deepseek+tiny", dtype=torch.float32, seed=3)


def _ids(batch: int, n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (batch, n), generator=torch.Generator().manual_seed(seed))


def _reference(model, ids: torch.Tensor) -> torch.Tensor:
    """[B, S, V]: the whole-sequence reference logits of each sequence."""
    return torch.stack([forward(model.cfg, model.params, row, model.layers) for row in ids])


def test_tiny_keeps_every_layer_kind():
    spec = ModelSpec.from_name("deepseek+tiny")
    assert spec.family == "deepseek_v4" and spec.hc_mult == 4
    assert set(spec.compress_ratios) == {0, spec.csa_ratio, 8} and spec.num_hash_layers >= 1
    assert ModelSpec.from_name("deepseek-v3").family == "deepseek_v3"
    assert ModelSpec.from_name("deepseek").name == "deepseek" and ModelSpec.from_name("deepseek").num_layers == 43


def test_prefill_then_decode_equals_the_longer_prefill(model):
    """19 tokens prefilled, then 9 decode steps (CSA windows close at 20, 24, 28; HCA at 24): each step's
    logits equal the reference's logits of the 28-token sequence at that position."""
    b, n, steps = 2, 19, 9
    ids = _ids(b, n + steps, 5)
    ref = _reference(model, ids)
    pre = make_workload(model, WorkloadPoint(phase="prefill", batch=b, context=0, chunk=n), fill="zeros",
                        token_ids=ids[:, :n], capacity=n + steps)
    torch.testing.assert_close(model.step(pre), ref[:, n - 1], **TOL)
    cache = pre.cache
    for j in range(steps):
        wl = make_workload(model, WorkloadPoint(phase="decode", batch=b, context=n + j), cache=cache,
                           token_ids=ids[:, n + j])
        torch.testing.assert_close(model.step(wl), ref[:, n + j], **TOL)


def test_chunked_prefill_equals_one_prefill(model):
    ids = _ids(1, 30, 7)
    ref = _reference(model, ids)
    first = make_workload(model, WorkloadPoint(phase="prefill", batch=1, context=0, chunk=13), fill="zeros",
                          token_ids=ids[:, :13], capacity=30)
    model.step(first)
    second = make_workload(model, WorkloadPoint(phase="prefill", batch=1, context=13, chunk=17), cache=first.cache,
                           token_ids=ids[:, 13:])
    torch.testing.assert_close(model.step(second), ref[:, -1], **TOL)


def test_entries_change_the_output(model):
    """The compressed entries are read: corrupting the cached entries of a long context changes the logits."""
    wl = make_workload(model, WorkloadPoint(phase="decode", batch=2, context=40), seed=1)
    base = model.step(wl)
    for pool in wl.cache.entries.values():
        pool.mul_(-1.0)
    assert not torch.allclose(model.step(wl), base, atol=1e-3)


def test_checkpoint_loading_is_refused_with_one_line(tmp_path):
    with pytest.raises(SpecError, match="not implemented yet"):
        build_model("deepseek+tiny", weights=tmp_path)


def test_relayout_keeps_the_cache_and_the_logits(model):
    """The judge re-pages a workload's cache in other block sizes: the compressed entries (per sequence, not
    paged) travel with the pages, so the step's logits stay the same."""
    from persistent_engine.inputs.workloads import relayout_workload

    wl = make_workload(model, WorkloadPoint(phase="decode", batch=2, context=37), seed=4)
    base = model.step(wl)
    moved = relayout_workload(model, make_workload(model, WorkloadPoint(phase="decode", batch=2, context=37), seed=4), 4, 9)
    torch.testing.assert_close(model.step(moved), base, **TOL)


def test_serving_refuses_v4_with_one_line(model):
    from persistent_engine.serving.engine import ServingConfig, ServingEngine

    with pytest.raises(SpecError, match="serving DeepSeek-V4 is not implemented yet"):
        ServingEngine(model, lambda kv: None, ServingConfig())
