"""compiler.search.inputs.tier_layers: default tiers, and on a GPU tiers whose weights fit its memory."""

from pathlib import Path

import pytest

from compiler.search.inputs import TIER_WEIGHT_SHARE, InputError, tier_layers
from persistent_engine.models.spec import DTYPE_BYTES, ModelSpec

H200 = 150.0e9                          # torch's total_memory of an H200, bytes


def weights(spec, layers) -> float:
    b = DTYPE_BYTES["bf16"]
    return spec.embedding_params() * b + sum(spec.weight_bytes_layer(i, "bf16") for i in layers)


def test_without_a_gpu_the_slow_tier_is_the_first_eight_layers_and_every_kind():
    ds = ModelSpec.from_name("deepseek-v3")
    assert tier_layers(ds, None, None) == ([0, 3], list(range(8)))
    assert tier_layers(ModelSpec.from_name("llama-1b"), 2, 3) == ([0, 1], [0, 1, 2])


def test_on_one_gpu_the_default_slow_tier_shrinks_until_both_tiers_fit():
    ds = ModelSpec.from_name("deepseek-v3")                      # ~23 GB per MoE layer in bf16
    fast, slow = tier_layers(ds, None, None, device_bytes=H200)
    assert fast == [0, 3] and slow[:4] == [0, 1, 2, 3] and len(slow) < 8
    assert weights(ds, fast) + weights(ds, slow) <= TIER_WEIGHT_SHARE * H200
    assert weights(ds, fast) + weights(ds, list(range(len(slow) + 1))) > TIER_WEIGHT_SHARE * H200
    _, alone = tier_layers(ds, None, None, device_bytes=H200, shared=False)   # slow engine on its own GPU
    assert len(alone) > len(slow)
    assert tier_layers(ModelSpec.from_name("llama-1b"), None, None, device_bytes=H200) == ([0], list(range(8)))


def test_tiers_that_cannot_fit_are_an_input_error_with_the_sizes():
    ds = ModelSpec.from_name("deepseek-v3")
    with pytest.raises(InputError, match=rf"deepseek-v3: the tiers' weights .* GB on one device\) exceed {TIER_WEIGHT_SHARE:.0%} of the device's 150.0 GB"):
        tier_layers(ds, None, 8, device_bytes=H200)          # an explicit --slow-layers is not shrunk
    with pytest.raises(InputError, match="pass fewer --slow-layers / --fast-layers"):
        tier_layers(ds, None, None, device_bytes=24e9)       # the fast tier alone is too big


def test_glm52_tiers_on_a_gpu_shrink_and_say_so():
    glm = ModelSpec.from_name("glm")                         # GLM-5.2: ~19.5 GB per MoE layer in bf16
    notes: list[str] = []
    fast, slow = tier_layers(glm, None, None, device_bytes=H200, notes=notes)
    assert fast == [0, 2, 3] and slow[:4] == [0, 1, 2, 3] and len(slow) < 8
    assert weights(glm, fast) + weights(glm, slow) <= TIER_WEIGHT_SHARE * H200
    assert len(notes) == 1 and notes[0].startswith(f"slow tier: layers {slow} instead of the default")
    notes.clear()
    tier_layers(ModelSpec.from_name("llama-1b"), None, None, device_bytes=H200, notes=notes)
    assert notes == []                                       # nothing shrunk, nothing said


def test_optimize_glm_on_a_small_machine_refuses_at_once_naming_tiny(monkeypatch, tmp_path, capsys):
    """`tkcc optimize --model glm --hw b200 --traffic ...` on a 24 GB CPU machine: one line, exit 2, within
    seconds (before any engine starts), pointing at --tiny."""
    import time

    from compiler.search import inputs
    from compiler.cli import main

    monkeypatch.setattr(inputs, "cpu_memory", lambda: 24e9)
    t0 = time.monotonic()
    conv = Path(__file__).parents[2] / "examples" / "traffic" / "azure2023_conv.parquet"
    rc = main(["optimize", "--model", "glm", "--hw", "b200", "--traffic", str(conv),
               "--device", "cpu", "--out", str(tmp_path / "p"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "--tiny" in err and f"exceed {inputs.TIER_WEIGHT_SHARE:.0%} of the device's 24.0 GB" in err
    assert time.monotonic() - t0 < 60
