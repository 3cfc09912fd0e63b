"""Shared by the family tests that compare tkcc's decoder with Hugging Face's modeling code."""

import pytest
import torch

from persistent_engine.io_struct import WorkloadPoint
from persistent_engine.models.decoder import make_decoder
from persistent_engine.models.spec import ModelSpec
from persistent_engine.models.weights import hf_to_internal, param_specs
from persistent_engine.inputs.workloads import make_workload


def last_logits(spec: ModelSpec, checkpoint: dict, ids: torch.Tensor) -> torch.Tensor:
    """tkcc's fp32 logits [B, V] of each sequence's last token after a prefill of ids[B, S], its weights
    loaded from ``checkpoint`` (published checkpoint names -> tensors) as a ``--weights`` load does."""
    layers = list(range(spec.num_layers))
    params = hf_to_internal(spec, layers, checkpoint.__getitem__)
    # the shapes a --weights load checks (load_weights: param_specs)
    assert {k: tuple(t.shape) for k, t in params.items()} == {k: s for k, (s, _) in param_specs(spec, layers).items()}
    model = make_decoder(spec, layers, params, "cpu", torch.float32)
    b, s = ids.shape
    wl = make_workload(model, WorkloadPoint("prefill", b, 0, s), token_ids=ids.flatten(), fill="zeros")
    return model.step(wl)


@pytest.fixture
def tkcc_last_logits():
    """``last_logits``, for the tests of this folder."""
    return last_logits
