import pytest
import torch

from persistent_engine.models.decoder import build_model
from persistent_engine.inputs.workloads import WorkloadError, make_workload
from persistent_engine.io_struct import WorkloadPoint


@pytest.fixture(scope="module")
def model():
    return build_model("tiny-dense")


def test_decode_workload_fields(model):
    wl = make_workload(model, WorkloadPoint(phase="decode", batch=3, context=20, chunk=1, weight=0.5), seed=1)
    assert wl.token_ids.shape == (3,) and wl.positions.tolist() == [20, 20, 20]
    assert wl.context_lens.tolist() == [21] * 3 and wl.context_lens.dtype == torch.int32
    assert wl.cu_seqlens_q.tolist() == [0, 1, 2, 3] and wl.last_token_index.tolist() == [0, 1, 2]
    assert len(set(wl.slot_mapping.tolist())) == 3 and wl.cache.capacity >= 21 and wl.point.weight == 0.5
    again = make_workload(model, WorkloadPoint(phase="decode", batch=3, context=20), seed=1)
    assert torch.equal(again.token_ids, wl.token_ids)
    assert torch.equal(again.cache.k[0], wl.cache.k[0])


def test_prefill_workload_layout(model):
    wl = make_workload(model, WorkloadPoint(phase="prefill", batch=2, context=5, chunk=4))
    assert wl.num_tokens == 8 and wl.positions.tolist() == [5, 6, 7, 8] * 2
    assert wl.cu_seqlens_q.tolist() == [0, 4, 8] and wl.last_token_index.tolist() == [3, 7]


def test_step_leaves_the_context_untouched(model):
    wl = make_workload(model, WorkloadPoint(phase="decode", batch=2, context=20))
    before = wl.cache.k[1].clone()
    model.step(wl)
    changed = (wl.cache.k[1] != before).any(-1).any(-1).flatten().nonzero().flatten()
    assert sorted(changed.tolist()) == sorted(wl.slot_mapping.tolist())     # only the new tokens' slots


def test_model_fill_and_zipf_tokens(model):
    wl = make_workload(model, WorkloadPoint(phase="decode", batch=1, context=40), fill="model", tokens="zipf", seed=2)
    rnd = make_workload(model, WorkloadPoint(phase="decode", batch=1, context=40), fill="random", seed=2)
    assert not torch.equal(wl.cache.k[0], rnd.cache.k[0])
    ids = make_workload(model, WorkloadPoint(phase="prefill", batch=1, context=0, chunk=2000), tokens="zipf").token_ids
    assert (ids < 16).float().mean() > 0.3                                   # skewed towards low ranks


def test_bad_points_are_user_errors(model):
    with pytest.raises(WorkloadError, match="unknown phase"):
        make_workload(model, WorkloadPoint(phase="train"))
    with pytest.raises(WorkloadError, match="exceeds"):
        make_workload(model, WorkloadPoint(phase="decode", batch=1, context=10 ** 6))
    small = make_workload(model, WorkloadPoint(phase="decode", batch=1, context=3))
    with pytest.raises(WorkloadError, match="cache holds"):
        make_workload(model, WorkloadPoint(phase="decode", batch=1, context=300), cache=small.cache)
    assert WorkloadError.user_error
