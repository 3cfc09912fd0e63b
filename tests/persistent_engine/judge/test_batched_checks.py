"""The batched verification requests on CPU: the judge's loops (``checks.remote_check``, ``remote_steps``) against
wires that answer in this process (``Worker.op_checks`` run here for the op checks), so that their logic is
tested without processes: every case judged once, a reply cut short by the mailbox budget asked again for the
rest, a wrong implementation rejected with the reasons ``check_op`` gives, replies of no or too many results refused."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import msgpack

from persistent_engine.executor import wire
from persistent_engine.executor.channel import ExecutorProtocolError, _default, unpack_frame
from persistent_engine.executor.launch import ExecutorBroke
from persistent_engine.executor.worker import Worker
from persistent_engine.judge import checks
from persistent_engine.judge.types import CandidateRaised
from persistent_engine.ops import registry
from persistent_engine.ops.contract import check_op


class _Loaded:
    def __init__(self, name, impl):
        self.overrides = {name: impl}


def _worker(name, impl, reply_bytes):
    """``Worker.op_checks``'s state only (the model, workloads and guards play no part in it)."""
    w = object.__new__(Worker)
    w.torch, w.registry, w.device = torch, registry, torch.device("cpu")
    w.candidate, w.reply_bytes = _Loaded(name, impl), reply_bytes
    return w


def _through_the_wire(reply, expect, tamper=None):
    """``reply`` as the judge decodes it off the socket (``tamper``: what a hostile executor does to the
    reply's map before it is sent); a reply that breaks the protocol is the executor's failure."""
    raw = wire.to_wire(dataclasses.replace(reply, nonce=7))
    raw = tamper(raw) if tamper else raw
    try:
        return wire.decode_reply(unpack_frame(msgpack.packb(raw, use_bin_type=True, default=_default)), expect, 7)
    except ExecutorProtocolError as e:
        raise ExecutorBroke("test", str(e)) from None


class _Wire:
    """The judge's ``_send`` / ``_receive``, the executor's half answered in this process through the wire's
    encoding (``tamper``: what a hostile executor does to the reply's map before it is sent)."""

    def __init__(self, worker, tamper=None):
        self.registry, self.worker, self.tamper, self.requests, self._msg = registry, worker, tamper, [], None

    def _send(self, msg, deadline):
        self.requests.append(msg)
        self._msg = msg

    def _receive(self, deadline, what):
        return _through_the_wire(self.worker.op_checks(self._msg), wire.OpResults, self.tamper)


SHAPES = [{"x": [5, 64]}, {"x": [9, 96]}, {"x": [1, 2048]}]
DTYPES = (torch.bfloat16, torch.float32)


def _remote(name, impl, reply_bytes=1 << 30, tamper=None, ahead_bytes=1 << 30):
    wire = _Wire(_worker(name, impl, reply_bytes), tamper)
    reasons = checks.remote_check(wire, float("inf"), ahead_bytes)(name, impl, device=torch.device("cpu"),
                                                                   dtypes=DTYPES, shapes=SHAPES, seed=11)
    return reasons, wire.requests


def test_one_request_carries_every_case_and_the_reference_passes():
    reasons, requests = _remote("fused_add_rms_norm", registry.get("fused_add_rms_norm").reference)
    assert reasons == []
    assert len(requests) == 1 and len(requests[0].cases) == len(SHAPES) * len(DTYPES)
    assert [c.seed for c in requests[0].cases] == [11, 1011, 2011] * 2


def test_a_reply_cut_short_by_the_mailbox_is_asked_again_for_the_rest():
    # a budget below one output: the executor answers one case per request (always at least one)
    reasons, requests = _remote("fused_add_rms_norm", registry.get("fused_add_rms_norm").reference, reply_bytes=64)
    assert reasons == []
    assert [len(r.cases) for r in requests] == [6, 5, 4, 3, 2, 1]


def test_a_wrong_implementation_gets_the_reasons_check_op_gives():
    ref = registry.get("rms_norm").reference
    bad = lambda x, w, eps: ref(x, w, eps) * 1.05        # noqa: E731
    reasons, _ = _remote("rms_norm", bad, reply_bytes=4096)
    local = check_op("rms_norm", bad, dtypes=DTYPES, shapes=SHAPES, seed=11)
    assert reasons == local and len(reasons) == 6 and all("mismatch" in r for r in reasons)


def test_a_modified_input_is_reported_per_case():
    def inplace(x):
        out = registry.get("silu_and_mul").reference(x)
        x.zero_()
        return out
    wire = _Wire(_worker("silu_and_mul", inplace, 1 << 30))
    reasons = checks.remote_check(wire, float("inf"))("silu_and_mul", inplace, device=torch.device("cpu"),
                                                      dtypes=(torch.float32,), shapes=[{"x": [5, 128]}], seed=3)
    assert reasons == ["silu_and_mul fp32 {'x': [5, 128]}: modified input: argument 0 changed"]


@pytest.mark.parametrize("tamper", [lambda r: {**r, "results": []}, lambda r: {**r, "results": r["results"] * 2},
                                    lambda r: {"op": r["op"], "nonce": r["nonce"]}])
def test_a_reply_of_no_or_too_many_results_is_refused(tamper):
    with pytest.raises(CandidateRaised, match="op_checks of rms_norm"):
        _remote("rms_norm", registry.get("rms_norm").reference, tamper=tamper)


@pytest.mark.parametrize("tamper", [lambda r: {**r, "results": "all fine"}, lambda r: {**r, "results": [1, 2]},
                                    lambda r: {**r, "nonce": r["nonce"] + 1}, lambda r: {**r, "op": "step_results"},
                                    lambda r: {**r, "extra": 1}, lambda r: {}])
def test_a_reply_of_another_type_kind_or_nonce_is_the_executors_failure(tamper):
    with pytest.raises(ExecutorBroke, match="broke the protocol"):
        _remote("rms_norm", registry.get("rms_norm").reference, tamper=tamper)


def test_outputs_forged_after_the_run_are_judged_as_sent():
    def forge(reply):                           # the executor replaces its outputs by zeros before sending
        for r in reply["results"]:
            r["outputs"] = [torch.zeros_like(o) for o in r["outputs"]]
        return reply
    reasons, _ = _remote("rms_norm", registry.get("rms_norm").reference, tamper=forge)
    assert len(reasons) == 6 and all("mismatch" in r for r in reasons)


class _Steps:
    """The judge's ``_call`` for ``steps`` requests, answering at most ``per_reply`` steps each."""

    def __init__(self, per_reply, tamper=None):
        self.per_reply, self.tamper, self.sizes = per_reply, tamper, []

    def _call(self, msg, deadline):
        assert isinstance(msg, wire.Steps)
        self.sizes.append(len(msg.steps))
        reply = wire.StepResults(results=[wire.StepResult(logits=torch.full((1, 4), float(s.i * 10 + s.v)))
                                          for s in msg.steps[:self.per_reply]])
        return _through_the_wire(reply, wire.StepResults, self.tamper)


def test_layer_level_steps_go_in_one_request_and_a_short_reply_is_asked_again():
    msgs = [wire.StepAsk(i=i, v=v) for i in range(3) for v in range(2)]
    whole = _Steps(per_reply=6)
    assert [float(r.logits[0, 0]) for r in checks.remote_steps(whole, msgs, float("inf"))] == \
        [0.0, 1.0, 10.0, 11.0, 20.0, 21.0]
    assert whole.sizes == [6]
    short = _Steps(per_reply=4)
    assert len(checks.remote_steps(short, msgs, float("inf"))) == 6 and short.sizes == [6, 2]


@pytest.mark.parametrize("tamper", [lambda r: {**r, "results": []}, lambda r: {**r, "results": r["results"] * 3}])
def test_a_steps_reply_of_no_or_too_many_results_is_refused(tamper):
    with pytest.raises(CandidateRaised, match="steps: the executor answered"):
        checks.remote_steps(_Steps(6, tamper), [wire.StepAsk(i=0, v=v) for v in range(2)], float("inf"))


def test_references_beyond_the_ahead_budget_are_computed_as_each_case_is_judged():
    ref = registry.get("rms_norm").reference                    # ahead_bytes=1: one reference ahead, the rest after
    assert _remote("rms_norm", ref, ahead_bytes=1)[0] == []
    bad = lambda x, w, eps: ref(x, w, eps) * 1.05                 # noqa: E731
    assert _remote("rms_norm", bad, ahead_bytes=1)[0] == \
        check_op("rms_norm", bad, dtypes=DTYPES, shapes=SHAPES, seed=11)


def test_an_implementation_that_reuses_one_output_buffer_is_judged_per_case():
    ref = registry.get("silu_and_mul").reference
    buffers = {}

    def reuses(x):                              # one output buffer per shape, rewritten by every call
        out = ref(x)
        buf = buffers.setdefault((tuple(out.shape), out.dtype), torch.empty_like(out))
        return buf.copy_(out)
    shapes = [{"x": [5, 128]}, {"x": [5, 128]}]          # the same shape twice: the buffer is shared
    wire = _Wire(_worker("silu_and_mul", reuses, 1 << 30))
    reasons = checks.remote_check(wire, float("inf"))("silu_and_mul", reuses, device=torch.device("cpu"),
                                                      dtypes=(torch.float32,), shapes=shapes, seed=5)
    assert reasons == [] and len(wire.requests) == 1
