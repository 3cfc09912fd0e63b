"""compiler.inputs.tier_layers: default tiers, and on a GPU tiers whose weights fit its memory."""

import pytest

from compiler.inputs import TIER_WEIGHT_SHARE, InputError, tier_layers
from persistent_engine.models.spec import DTYPE_BYTES, ModelSpec

H200 = 150.0e9                          # torch's total_memory of an H200, bytes


def weights(spec, layers) -> float:
    b = DTYPE_BYTES["bf16"]
    return spec.embedding_params() * b + sum(spec.weight_bytes_layer(i, "bf16") for i in layers)


def test_without_a_gpu_the_slow_tier_is_the_first_eight_layers_and_every_kind():
    ds = ModelSpec.from_name("deepseek")
    assert tier_layers(ds, None, None) == ([0, 3], list(range(8)))
    assert tier_layers(ModelSpec.from_name("llama-1b"), 2, 3) == ([0, 1], [0, 1, 2])


def test_on_one_gpu_the_default_slow_tier_shrinks_until_both_tiers_fit():
    ds = ModelSpec.from_name("deepseek")                      # ~23 GB per MoE layer in bf16
    fast, slow = tier_layers(ds, None, None, device_bytes=H200)
    assert fast == [0, 3] and slow[:4] == [0, 1, 2, 3] and len(slow) < 8
    assert weights(ds, fast) + weights(ds, slow) <= TIER_WEIGHT_SHARE * H200
    assert weights(ds, fast) + weights(ds, list(range(len(slow) + 1))) > TIER_WEIGHT_SHARE * H200
    _, alone = tier_layers(ds, None, None, device_bytes=H200, shared=False)   # slow engine on its own GPU
    assert len(alone) > len(slow)
    assert tier_layers(ModelSpec.from_name("llama-1b"), None, None, device_bytes=H200) == ([0], list(range(8)))


def test_tiers_that_cannot_fit_are_an_input_error_with_the_sizes():
    ds = ModelSpec.from_name("deepseek")
    with pytest.raises(InputError, match=rf"deepseek: the tiers' weights .* GB on one device\) exceed {TIER_WEIGHT_SHARE:.0%} of the device's 150.0 GB"):
        tier_layers(ds, None, 8, device_bytes=H200)          # an explicit --slow-layers is not shrunk
    with pytest.raises(InputError, match="pass fewer --slow-layers / --fast-layers"):
        tier_layers(ds, None, None, device_bytes=24e9)       # the fast tier alone is too big
