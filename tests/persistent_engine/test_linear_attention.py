"""Gated delta rule linear attention (Qwen3.5): the recurrent form against the chunk-parallel form, the ops
against per-token loops, the state carried across steps (prefill then decode equals a longer prefill), and a
candidate that corrupts the recurrent state rejected by the op contract."""

import pytest
import torch

from persistent_engine.models import build_model
from persistent_engine.models.spec import ModelSpec, SpecError
from persistent_engine.ops import linear_attention as la
from persistent_engine.ops import registry
from persistent_engine.ops.contract import check_op
from persistent_engine.inputs.workloads import make_workload
from persistent_engine.io_struct import WorkloadPoint

F64 = torch.float64


def _core_inputs(length, heads, dk, dv, per_channel, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = la.l2norm(torch.randn(length, heads, dk, generator=g, dtype=F64)) * dk ** -0.5
    k = la.l2norm(torch.randn(length, heads, dk, generator=g, dtype=F64))
    v = torch.randn(length, heads, dv, generator=g, dtype=F64)
    decay = -torch.rand(length, heads, *((dk,) if per_channel else ()), generator=g, dtype=F64) * 2
    beta = torch.rand(length, heads, generator=g, dtype=F64)
    return q, k, v, decay, beta, torch.randn(heads, dk, dv, generator=g, dtype=F64)


@pytest.mark.parametrize("per_channel", [False, True])          # Qwen3.5 (per head) and KDA-style (per channel)
@pytest.mark.parametrize("length,chunk", [(150, 64), (7, 4), (1, 64)])
def test_chunked_form_matches_recurrent_form(per_channel, length, chunk):
    args = _core_inputs(length, 3, 16, 8, per_channel)
    o_rec, s_rec = la.recurrent_gated_delta(*args)
    o_chk, s_chk = la.chunk_gated_delta(*args, chunk=chunk)
    torch.testing.assert_close(o_chk, o_rec, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(s_chk, s_rec, atol=1e-10, rtol=1e-10)


def test_delta_rule_writes_the_value_at_full_strength():
    """beta = 1, no decay: after writing (k, v) the state answers query k with exactly v (the delta rule's
    defining property, which a plain linear-attention sum lacks)."""
    q, k, v, _, _, s0 = _core_inputs(1, 2, 8, 4, False)
    o, s = la.recurrent_gated_delta(k, k, v, torch.zeros(1, 2, dtype=F64), torch.ones(1, 2, dtype=F64), s0)
    torch.testing.assert_close(o, v, atol=1e-5, rtol=1e-5)        # |k|^2 = 1 - O(eps)


def test_decode_op_is_one_step_of_the_recurrence_with_grouped_heads():
    shape = {"B": 3, "Hk": 2, "Hv": 4, "Dk": 16, "Dv": 8}
    q, k, v, g, beta, state = registry.get("gated_delta_decode").make_inputs(shape, torch.float32, "cpu", 1)
    o, new = la.gated_delta_decode(q, k, v, g, beta, state)
    for b in range(3):
        qb = la.l2norm(q[b:b + 1].double()).repeat_interleave(2, dim=1) * 16 ** -0.5
        kb = la.l2norm(k[b:b + 1].double()).repeat_interleave(2, dim=1)
        ob, sb = la.recurrent_gated_delta(qb, kb, v[b:b + 1].double(), g[b:b + 1].double(), beta[b:b + 1].double(),
                                          state[b].double())
        torch.testing.assert_close(o[b].double(), ob[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(new[b].double(), sb, atol=1e-5, rtol=1e-5)


def test_prefill_op_equals_decode_steps():
    """A ragged prefill equals running gated_delta_decode token by token from each sequence's state."""
    shape = {"B": 2, "chunk": 70, "Hk": 1, "Hv": 2, "Dk": 8, "Dv": 8}
    q, k, v, g, beta, state, cu = registry.get("gated_delta_prefill").make_inputs(shape, torch.float32, "cpu", 2)
    o, final = la.gated_delta_prefill(q, k, v, g, beta, state, cu)
    for b in range(2):
        s = state[b:b + 1]
        for t in range(int(cu[b]), int(cu[b + 1])):
            ot, s = la.gated_delta_decode(q[t:t + 1], k[t:t + 1], v[t:t + 1], g[t:t + 1], beta[t:t + 1], s)
            torch.testing.assert_close(o[t], ot[0], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(final[b], s[0], atol=1e-4, rtol=1e-4)


def test_conv_prefill_equals_conv_decode_steps():
    x, state, w, cu = registry.get("causal_conv1d_prefill").make_inputs({"B": 2, "chunk": 6, "C": 5, "K": 4},
                                                                        torch.float32, "cpu", 3)
    y, new = la.causal_conv1d_prefill(x, state, w, cu)
    for b in range(2):
        s = state[b:b + 1]
        for t in range(int(cu[b]), int(cu[b + 1])):
            yt, s = la.causal_conv1d_decode(x[t:t + 1], s, w)
            torch.testing.assert_close(y[t], yt[0])
        torch.testing.assert_close(new[b], s[0])


@pytest.mark.parametrize("name", ["gated_delta_decode", "gated_delta_prefill", "causal_conv1d_decode",
                                  "causal_conv1d_prefill", "gdn_gating", "gated_rms_norm", "sigmoid_gate"])
def test_references_honour_the_contract(name):
    assert check_op(name, registry.get(name).reference) == []


def _corrupt_state(q, k, v, g, beta, state):
    o, new = la.gated_delta_decode(q, k, v, g, beta, state)
    return o, state.clone()                    # right output, state not advanced


def _drifting_state(q, k, v, g, beta, state):
    o, new = la.gated_delta_decode(q, k, v, g, beta, state)
    return o, new * 1.05


@pytest.mark.parametrize("bad", [_corrupt_state, _drifting_state])
def test_a_candidate_that_corrupts_the_state_is_rejected(bad):
    reasons = check_op("gated_delta_decode", bad)
    assert reasons and all("output 1" in r for r in reasons), reasons


# ----------------------------------------------------------------------------- the model
def _model():
    return build_model("qwen3.5+tiny", dtype=torch.float32, seed=1)


def _run(model, context, ids, phase):
    """Logits of ``ids`` [B, n] run as one step on top of ``context`` (a workload whose cache holds it)."""
    b, n = ids.shape
    point = WorkloadPoint(phase=phase, batch=b, context=context if isinstance(context, int) else context.context + context.chunk, chunk=n)
    cache = None if isinstance(context, int) else context.cache
    wl = make_workload(model, point, cache=cache, token_ids=ids.flatten(), fill="zeros", capacity=96)
    out = model.step(wl)
    wl.cache.commit_states()
    return out, wl


@pytest.mark.parametrize("first", [5, 70])            # 70: the prefill crosses a 64-token chunk
def test_prefill_then_decode_equals_a_longer_prefill(first):
    model = _model()
    ids = torch.randint(0, model.spec.vocab_size, (2, first + 2), generator=torch.Generator().manual_seed(4))
    want, _ = _run(model, 0, ids, "prefill")
    _, pre = _run(model, 0, ids[:, :first], "prefill")
    _, dec = _run(model, pre, ids[:, first:first + 1], "decode")
    got, _ = _run(model, dec, ids[:, first + 1:], "decode")
    torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4)
    # and two prefill chunks equal one
    _, pre = _run(model, 0, ids[:, :first], "prefill")
    got2, _ = _run(model, pre, ids[:, first:], "prefill")
    torch.testing.assert_close(got2, want, atol=2e-4, rtol=2e-4)


def test_the_state_matters():
    """Dropping the carried state (a fresh zero state before the last token) changes the logits."""
    model = _model()
    ids = torch.randint(0, model.spec.vocab_size, (1, 9), generator=torch.Generator().manual_seed(5))
    _, pre = _run(model, 0, ids[:, :8], "prefill")
    good, _ = _run(model, pre, ids[:, 8:], "decode")
    for i in pre.cache.state:
        pre.cache.state[i].zero_()
        pre.cache.conv[i].zero_()
    bad, _ = _run(model, pre, ids[:, 8:], "decode")
    assert (good - bad).abs().max() > 1e-3


def test_a_step_can_be_replayed():
    model = _model()
    wl = make_workload(model, WorkloadPoint(phase="decode", batch=3, context=11))
    torch.testing.assert_close(model.step(wl), model.step(wl), atol=0, rtol=0)


# ----------------------------------------------------------------------------- the config
def test_qwen3_5_config_is_parsed_with_its_layer_interleave():
    s = ModelSpec.from_name("qwen3.5")
    assert s.family == "qwen3_5_moe" and s.num_layers == 40
    assert [i for i in range(40) if not s.is_linear(i)] == list(range(3, 40, 4))
    assert (s.linear_num_k_heads, s.linear_num_v_heads, s.linear_k_dim, s.linear_conv_kernel) == (16, 32, 128, 4)
    assert s.attn_output_gate and s.shared_expert_gate and s.rotary_dim == 64 and s.gemma_norm
    assert round(s.total_params() / 1e9, 1) == 34.7 and round(s.active_params() / 1e9, 1) == 3.5
    assert s.covering_layers() == [0, 3]
    assert ModelSpec.from_name("qwen3.5-moe") == s.replace(name="qwen3.5-moe")


def _cfg(**text):
    import json

    from persistent_engine.models.spec import CONFIG_DIR
    c = json.loads((CONFIG_DIR / "qwen3.5-moe.json").read_text())
    c["text_config"].update(text)
    return c


@pytest.mark.parametrize("change,word", [({"mamba_ssm_dtype": "bfloat16"}, "mamba_ssm_dtype"),
                                         ({"full_attention_interval": 2}, "full_attention_interval"),
                                         ({"linear_num_value_heads": 24, "linear_num_key_heads": 16},
                                          "linear_num_value_heads"),
                                         ({"some_new_key": 1}, "some_new_key")])
def test_unimplemented_qwen3_5_values_are_refused(change, word):
    with pytest.raises(SpecError, match=word):
        ModelSpec.from_config(_cfg(**change), "q")


def test_interval_alone_gives_the_interleave():
    c = _cfg()
    del c["text_config"]["layer_types"]
    c["text_config"]["full_attention_interval"] = 2
    s = ModelSpec.from_config(c, "q")
    assert s.linear_layers[:4] == (True, False, True, False)
