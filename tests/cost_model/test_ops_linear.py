"""cost_model.ops_linear: a Qwen3.5 decode step's linear layers cost their state (read + write, independent of
the context), its full layers their KV cache, and the layer counts follow the interleave."""

from cost_model.layout import Layout
from cost_model.ops import step_ops
from persistent_engine.models.spec import ModelSpec
from traffic_profiles import TrafficPoint


def _by_name(point):
    return {o.name: o for o in step_ops(ModelSpec.from_name("qwen3.5"), Layout(), point)}


def test_linear_layers_cost_their_state_not_the_context():
    short, long = _by_name(TrafficPoint(phase="decode", batch=8, context=512)), _by_name(
        TrafficPoint(phase="decode", batch=8, context=8192))
    gd = short["gated_delta_decode"]
    assert gd.count == 30 and short["attention_decode"].count == 10
    assert gd.bytes >= 2 * 8 * 32 * 128 * 128 * 4 and gd.bytes == long["gated_delta_decode"].bytes
    assert long["attention_decode"].bytes > 8 * short["attention_decode"].bytes


def test_prefill_is_chunked():
    ops = _by_name(TrafficPoint(phase="prefill", batch=1, context=0, chunk=4096))
    assert "gated_delta_prefill" in ops and ops["gated_delta_prefill"].flops > 0
