"""Sliding-window attention and attention sinks: the ops against a per-token loop, Qwen3 configs that ask
for windows get them (and the window changes the output), sinks change the softmax as gpt-oss's do."""

import json

import pytest
import torch

from persistent_engine.models import build_model
from persistent_engine.models.spec import CONFIG_DIR, ModelSpec
from persistent_engine.ops import registry
from persistent_engine.ops.window import attention_decode_window, attention_prefill_window
from persistent_engine.inputs.workloads import make_workload
from persistent_engine.io_struct import WorkloadPoint

F32 = torch.float32


def _rows(cache, bt, b, n):
    bs = cache.shape[1]
    return torch.stack([cache[int(bt[b, j // bs]), j % bs] for j in range(n)])


def _loop(q, kc, vc, bt, seq_pos, scale, window, sinks):
    out = torch.empty_like(q)
    hq, hk = q.shape[1], kc.shape[2]
    for t, (b, p) in enumerate(seq_pos):
        lo = p - window + 1 if window else 0
        k, v = _rows(kc, bt, b, p + 1)[max(lo, 0):], _rows(vc, bt, b, p + 1)[max(lo, 0):]
        for h in range(hq):
            s = k[:, h // (hq // hk)] @ q[t, h] * scale
            if sinks is not None:
                s = torch.cat([s, sinks[h].view(1)])
            w = torch.softmax(s, -1)[: k.shape[0]]
            out[t, h] = w @ v[:, h // (hq // hk)]
    return out


@pytest.mark.parametrize("shape", [{"B": 3, "Hq": 4, "Hk": 2, "Dh": 16, "Dv": 16, "ctx": 37, "BS": 16, "window": 8},
                                   {"B": 2, "Hq": 4, "Hk": 1, "Dh": 16, "Dv": 16, "ctx": 21, "BS": 4, "window": 5,
                                    "sinks": True}])
def test_windowed_decode_matches_a_loop(shape):
    q, kc, vc, bt, cl, scale, window, sinks = registry.get("attention_decode_window").make_inputs(shape, F32, "cpu", 2)
    got = attention_decode_window(q, kc, vc, bt, cl, scale, window, sinks)
    want = _loop(q, kc, vc, bt, [(b, int(cl[b]) - 1) for b in range(shape["B"])], scale, window, sinks)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_windowed_prefill_matches_a_loop():
    shape = {"B": 2, "chunk": 5, "Hq": 4, "Hk": 2, "Dh": 16, "Dv": 16, "ctx": 21, "BS": 8, "window": 6, "sinks": True}
    q, kc, vc, bt, cu, cl, scale, window, sinks = registry.get("attention_prefill_window").make_inputs(shape, F32,
                                                                                                       "cpu", 4)
    seq_pos = [(b, int(cl[b]) - 5 + i) for b in range(2) for i in range(5)]
    torch.testing.assert_close(attention_prefill_window(q, kc, vc, bt, cu, cl, scale, window, sinks),
                               _loop(q, kc, vc, bt, seq_pos, scale, window, sinks), atol=1e-5, rtol=1e-5)


def test_qwen3_sliding_window_config_is_honoured():
    cfg = json.loads((CONFIG_DIR / "qwen3-moe.json").read_text())
    spec = ModelSpec.from_config({**cfg, "use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 24},
                                 name="q")
    assert [spec.layer_window(i) for i in (0, 23, 24, 47)] == [0, 0, 4096, 4096]
    assert spec.covering_layers() == [0, 24]
    assert ModelSpec.from_config(cfg, name="q").layer_windows == ()          # use_sliding_window false: none
    tiny = spec.scaled_down()
    assert tiny.layer_windows == (0, 8)
    point = WorkloadPoint(phase="decode", batch=2, context=30)

    def logits(s):
        m = build_model(s, dtype=F32, seed=3)
        return m.step(make_workload(m, point, seed=1))
    assert (logits(tiny) - logits(tiny.replace(layer_windows=()))).abs().max() > 1e-3
    torch.testing.assert_close(logits(tiny.replace(layer_windows=(0, 64))), logits(tiny.replace(layer_windows=())),
                               atol=1e-4, rtol=1e-4)                        # a window past the context is full


def test_sinks_take_probability_mass():
    spec = ModelSpec.from_name("tiny-dense").replace(attention_sinks=True)
    model = build_model(spec, dtype=F32)
    assert model.params["layers.0.sinks"].shape == (spec.num_heads,)
    wl = make_workload(model, WorkloadPoint(phase="decode", batch=2, context=20))
    with_sinks = model.step(wl)
    for i in model.layers:
        model.params[f"layers.{i}.sinks"].fill_(-1e4)                       # a sink of ~0 probability
    torch.testing.assert_close(model.step(wl), build_model("tiny-dense", dtype=F32).step(wl), atol=1e-4, rtol=1e-4)
    assert (with_sinks - model.step(wl)).abs().max() > 1e-4
