"""The cost model's attended keys for Llama-4's chunked rope layers and its NoPE layers."""

from cost_model.ops import attended_keys
from persistent_engine.models.spec import ModelSpec


def test_llama4_rope_layers_read_at_most_one_chunk():
    spec = ModelSpec.from_name("llama4")                      # chunk 8192, every 4th of 48 layers NoPE
    assert attended_keys(spec, 4096) == 4096
    assert attended_keys(spec, 1 << 20) == (36 * 8192 + 12 * (1 << 20)) / 48
    assert attended_keys(spec.replace(attention_chunk_size=0), 1 << 20) == 1 << 20
