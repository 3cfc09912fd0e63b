"""Kimi-K3 (kimi_linear): the KDA forms agree, the state is carried right, verification rejects a corrupted state,
the config is read without silent drops."""

from __future__ import annotations

import json

import pytest
import torch

from persistent_engine.models.decoder import build_model
from persistent_engine.models.spec import ModelSpec, SpecError
from persistent_engine.ops import kda
from persistent_engine.ops.contract import check_op
from persistent_engine.inputs.workloads import make_workload
from persistent_engine.io_struct import WorkloadPoint


def _qkvgb(b, t, h, kd, vd, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(b, t, h, kd, generator=g, dtype=torch.float64), dim=-1) * kd ** -0.5
    k = torch.nn.functional.normalize(torch.randn(b, t, h, kd, generator=g, dtype=torch.float64), dim=-1)
    v = torch.randn(b, t, h, vd, generator=g, dtype=torch.float64)
    gate = -5.0 * torch.rand(b, t, h, kd, generator=g, dtype=torch.float64)
    beta = torch.rand(b, t, h, generator=g, dtype=torch.float64)
    return q, k, v, gate, beta, torch.randn(b, h, kd, vd, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("t,chunk", [(1, 16), (37, 16), (64, 64), (50, 8)])
def test_recurrent_and_chunked_forms_agree(t, chunk):
    args = _qkvgb(2, t, 3, 8, 6)
    o1, s1 = kda.kda_recurrent(*args)
    o2, s2 = kda.kda_chunked(*args, chunk=chunk)
    assert torch.allclose(o1, o2, atol=1e-10) and torch.allclose(s1, s2, atol=1e-10)


def _op_args(phase, b=2, chunk=9, seed=3):
    shape = {"B": b, "H": 2, "K": 8, "V": 8, "lb": -5.0, "chunk": chunk}
    args = kda._kda_inputs(phase)(shape, torch.float64, "cpu", seed)
    return args[:8] + (args[8].double(),) + args[9:]                 # the state in float64 too


def test_prefill_equals_decode_steps_and_chunk_split():
    q, k, v, f, b, a, dt, lb, s0, cu = _op_args("prefill")
    o, s = kda.kda_prefill(q, k, v, f, b, a, dt, lb, s0, cu)
    ol, sl = kda.kda_prefill(q, k, v, f, b, a, dt, lb, s0, cu, form=kda.kda_recurrent)
    assert torch.allclose(o, ol, atol=1e-10) and torch.allclose(s, sl, atol=1e-10)
    state, outs = s0, []
    for j in range(9):                                   # token j of both sequences: rows j and 9 + j
        rows = torch.tensor([j, 9 + j])
        oj, state = kda.kda_decode(q[rows], k[rows], v[rows], f[rows], b[rows], a, dt, lb, state)
        outs.append(oj)
    stepped = torch.stack(outs, 1).reshape(18, 2, 8)
    assert torch.allclose(stepped, o, atol=1e-10) and torch.allclose(state, s, atol=1e-10)


def test_short_conv_prefill_equals_decode_steps():
    x, st, w, cu = kda._conv_inputs("prefill")({"B": 2, "chunk": 5, "D": 6, "W": 4}, torch.float64, "cpu", 1)
    y, s = kda.short_conv_prefill(x, st, w, cu)
    state, ys = st, []
    for j in range(5):
        yj, state = kda.short_conv_decode(x[torch.tensor([j, 5 + j])], state, w)
        ys.append(yj)
    assert torch.allclose(torch.stack(ys, 1).reshape(10, 6), y) and torch.equal(state, s)


def test_a_candidate_corrupting_the_state_is_rejected():
    def leaky(*args):                                    # right output, state off by a small drift
        o, s = kda.kda_decode(*args)
        return o, s * 0.98

    def forgetful(*args):                               # right output, prefill forgets the state's decay
        o, s = kda.kda_prefill(*args)
        return o, s + 0.05
    assert check_op("kda_decode", kda.kda_decode) == []
    reasons = check_op("kda_decode", leaky)
    assert reasons and all("output 1" in r for r in reasons)
    assert any("output 1" in r for r in check_op("kda_prefill", forgetful))


def _tiny(**changes):
    return ModelSpec.from_name("kimi+tiny").replace(**changes)


def _tokens(n, batch=2, seed=0):
    return torch.randint(0, 256, (batch, n), generator=torch.Generator().manual_seed(seed))


def _prefill(model, ids, cache=None, context=0):
    b, n = ids.shape
    wl = make_workload(model, WorkloadPoint(phase="prefill", batch=b, context=context, chunk=n), cache=cache,
                       token_ids=ids.flatten(), fill="zeros", capacity=32)
    return model.step(wl), wl.cache


def test_prefill_then_decode_equals_a_longer_prefill():
    model = build_model(_tiny(), dtype=torch.float32)
    ids = _tokens(10)
    want, _ = _prefill(model, ids)
    _, cache = _prefill(model, ids[:, :6])
    cache.commit_states()
    part, cache = _prefill(model, ids[:, 6:9], cache=cache, context=6)        # a second chunk: conv + state carried
    cache.commit_states()
    wl = make_workload(model, WorkloadPoint(phase="decode", batch=2, context=9), cache=cache, token_ids=ids[:, 9])
    got = model.step(wl)
    assert torch.allclose(got, model.step(wl))                                 # a step can run again
    assert torch.allclose(got, want, atol=1e-4), float((got - want).abs().max())
    cache.commit_states()
    stale = make_workload(model, WorkloadPoint(phase="decode", batch=2, context=9), cache=cache, token_ids=ids[:, 9])
    assert not torch.allclose(model.step(stale), want, atol=1e-3)            # the state is really used


def test_lower_bound_and_attention_residuals_change_the_output():
    ids = _tokens(5)
    base = _prefill(build_model(_tiny(), dtype=torch.float32), ids)[0]
    for changes in ({"kda_gate_lower_bound": None}, {"attn_res_block_size": 0}, {"situ_linear_beta": 0.5},
                    {"mla_output_gate": False}):
        other = _prefill(build_model(_tiny(**changes), dtype=torch.float32), ids)[0]
        assert not torch.allclose(base, other, atol=1e-3), changes


def test_aliases_and_k3_fields():
    k3 = ModelSpec.from_name("kimi")
    assert (k3.family, k3.num_layers, sum(k3.kda_layers), k3.num_experts, k3.num_experts_per_tok) == \
        ("kimi_linear", 93, 69, 896, 16)
    assert (k3.is_kda_layer(0), k3.is_kda_layer(3), k3.is_kda_layer(92)) == (True, False, False)
    assert (k3.latent_moe_size, k3.mlp_act, k3.situ_beta, k3.situ_linear_beta, k3.attn_res_block_size) == \
        (3584, "situ", 4.0, 25.0, 12)
    assert ModelSpec.from_name("kimi-k2").family == "deepseek_v3"
    assert 2.7e12 < k3.total_params() < 2.9e12
    assert k3.kv_bytes_per_token_layer(layer=0) == 0 and k3.state_bytes_per_seq_layer(0) > 0


def _k3_config():
    from persistent_engine.models.spec import CONFIG_DIR
    return json.loads((CONFIG_DIR / "kimi-k3.json").read_text())


@pytest.mark.parametrize("edit, word", [
    (lambda c: c["text_config"]["linear_attn_config"].update(new_gate=1), "new_gate"),
    (lambda c: c["text_config"].update(mla_use_nope=False), "mla_use_nope"),
    (lambda c: c["text_config"].update(hidden_act="gelu"), "hidden_act"),
    (lambda c: c["text_config"].update(add_cross_attention=True), "add_cross_attention"),
    (lambda c: c.update(audio_config={}), "audio_config"),
    (lambda c: c["text_config"]["quantization_config"].update(format="nvfp4-pack-quantized"), "quantization_config"),
])
def test_a_changed_k3_config_is_refused_with_one_line(edit, word):
    cfg = _k3_config()
    edit(cfg)
    with pytest.raises(SpecError) as e:
        ModelSpec.from_config(cfg, name="k3")
    assert word in str(e.value) and "\n" not in str(e.value)
