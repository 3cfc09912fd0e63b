"""The typed judge <-> executor messages (``wire.py``) and the channel's limits, without processes: a reply
decodes only as its request's class with its nonce; sizes are bounded before anything is allocated; a
half-written frame never blocks the reader; the mailbox cannot be shrunk; candidate text comes back escaped
and bounded."""

import fcntl
import os
import socket
import struct
import tracemalloc

import msgpack
import pytest
import torch

from persistent_engine.executor import channel, wire
from persistent_engine.executor.channel import Channel, Mailbox, ExecutorProtocolError, unpack_frame


def _raw(reply, nonce=5):
    """``reply`` as the judge receives it: packed by the executor's channel, unpacked by the judge's."""
    body = msgpack.packb(wire.to_wire(reply), use_bin_type=True, default=channel._default)
    return unpack_frame(body)


def test_every_request_kind_has_one_reply_class_and_round_trips():
    assert set(wire.REPLY_OF) == {c for k, c in wire.REQUESTS.items() if k != "exit"}
    req = wire.TimedRun(nonce=3, i=1, v=0, k=4, ids=torch.arange(8).view(4, 2), chain=100)
    got = wire.decode_request(_raw(req))
    assert isinstance(got, wire.TimedRun) and got.nonce == 3 and got.k == 4 and torch.equal(got.ids, req.ids)
    steps = wire.Steps(nonce=9, steps=[wire.StepAsk(i=2, v=1, moe=True, refs=[{"ids": torch.ones(3)}])])
    back = wire.decode_request(_raw(steps))
    assert back.steps[0].i == 2 and torch.equal(back.steps[0].refs[0]["ids"], torch.ones(3))
    reply = wire.StepResults(nonce=5, results=[wire.StepResult(logits=torch.randn(2, 3), calls={"rms_norm": 2})])
    out = wire.decode_reply(_raw(reply), wire.StepResults, 5)
    assert torch.equal(out.results[0].logits, reply.results[0].logits) and out.results[0].calls == {"rms_norm": 2}


@pytest.mark.parametrize("tamper, match", [
    (lambda r: {**r, "nonce": 6}, "wrong nonce"),
    (lambda r: {k: v for k, v in r.items() if k != "nonce"}, "wrong nonce"),
    (lambda r: {**r, "op": "ran"}, "expected a 'guards_reply' reply"),
    (lambda r: {**r, "reasons": "fine"}, "field 'reasons'"),
    (lambda r: {**r, "reasons": [{"__t__": "float32", "shape": [1], "data": b"abcd"}]}, "field 'reasons'"),
    (lambda r: {**r, "verdict": "correct"}, "has no field"),
])
def test_a_reply_of_another_kind_nonce_or_type_is_a_protocol_error(tamper, match):
    raw = _raw(wire.GuardsReply(nonce=5, reasons=["x"]))
    with pytest.raises(ExecutorProtocolError, match=match):
        wire.decode_reply(tamper(raw), wire.GuardsReply, 5)


def test_a_failed_reply_is_accepted_for_any_request_and_its_kind_is_one_of_three():
    got = wire.decode_reply(_raw(wire.Failed(nonce=5, error="boom", kind="root")), wire.Ran, 5)
    assert isinstance(got, wire.Failed) and got.kind == "candidate"


@pytest.mark.parametrize("data", [3 << 30, "x" * 16, [0] * 16, None])
def test_tensor_data_that_is_not_bytes_of_its_size_allocates_nothing(data):
    raw = {"op": "step_results", "nonce": 5,
           "results": [{"logits": {"__t__": "float32", "shape": [3 << 28], "data": data}}]}
    tracemalloc.start()
    try:
        with pytest.raises(ExecutorProtocolError):
            wire.decode_reply(raw, wire.StepResults, 5)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


@pytest.mark.parametrize("packed", [
    {"__t__": "load", "shape": [1], "data": b"\0" * 4},              # an attribute of torch, not a dtype
    {"__t__": "float32", "shape": [1] * 9, "data": b"\0" * 4},
    {"__t__": "float32", "shape": [-1], "data": b"\0" * 4},
    {"__t__": "float32", "shape": [2], "data": b"\0" * 4},
])
def test_packed_tensors_are_checked_before_they_are_built(packed):
    with pytest.raises(ExecutorProtocolError):
        channel.unpack_tensor(packed)


def test_a_frame_of_many_small_containers_is_refused_within_the_item_limit():
    body = msgpack.packb({"op": "loaded", "reasons": [{} for _ in range(channel.MAX_ITEMS + 1)]})
    tracemalloc.start()
    try:
        with pytest.raises(ExecutorProtocolError, match="list and map entries"):
            unpack_frame(body)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 100 * channel.MAX_ITEMS            # ~64 B a dict: what the limit lets through, no more


def _pair(max_frame=channel.MAX_REPLY_BYTES):
    a, b = socket.socketpair()
    return Channel(a, max_frame=max_frame), b


def test_a_half_written_header_or_body_times_out_then_fails_the_sender(monkeypatch):
    monkeypatch.setattr(channel, "FRAME_STALL_S", 0.2)
    for partial in (b"\x10\x00", struct.pack("<I", 1000) + b"\x81" * 10):
        judge, theirs = _pair()
        theirs.sendall(partial)
        with pytest.raises(TimeoutError):            # the read returns at its deadline: never blocks
            judge.recv(timeout=0.05)
        with pytest.raises(ExecutorProtocolError, match="stalled"):
            for _ in range(20):
                try:
                    judge.recv(timeout=0.05)
                except TimeoutError:
                    pass


def test_a_frame_split_across_reads_is_kept_and_completed():
    judge, theirs = _pair()
    body = msgpack.packb({"op": "ran", "nonce": 1, "k": 2})
    frame = struct.pack("<I", len(body)) + body
    theirs.sendall(frame[:3])
    with pytest.raises(TimeoutError):
        judge.recv(timeout=0.05)
    theirs.sendall(frame[3:])
    assert judge.recv(timeout=1) == {"op": "ran", "nonce": 1, "k": 2}


def test_a_length_over_the_limit_is_refused_before_any_body_is_read():
    judge, theirs = _pair(max_frame=1 << 20)
    theirs.sendall(struct.pack("<I", (1 << 20) + 1))
    with pytest.raises(ExecutorProtocolError, match="exceeds"):
        judge.recv(timeout=1)


def test_the_mailbox_is_sealed_against_shrink_and_grow():
    box = Mailbox.create(1 << 20)
    assert box.sealed()
    theirs = os.dup(box.fd)                          # what the executor inherits
    for size in (0, 4096, 2 << 20):
        with pytest.raises(PermissionError):
            os.ftruncate(theirs, size)
    with pytest.raises(PermissionError):
        fcntl.fcntl(theirs, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE)      # nor can seals change (F_SEAL_SEAL)
    os.close(theirs)
    box.close()


def test_a_truncated_unsealed_box_is_a_protocol_error_not_a_sigbus():
    fd = os.memfd_create("unsealed")                 # a kernel without sealing: the size is checked per take
    os.ftruncate(fd, 1 << 20)
    box = Mailbox(fd, 1 << 20)
    os.ftruncate(fd, 0)
    with pytest.raises(ExecutorProtocolError, match="truncated"):
        box.take({"__m__": "float32", "shape": [16], "offset": 0, "nbytes": 64})
    box.close()


def test_one_reply_copies_at_most_the_box_out_of_it():
    box = Mailbox.create(1 << 20)
    ref = {"__m__": "uint8", "shape": [3 << 18], "offset": 0, "nbytes": 3 << 18}
    raw = {"op": "op_results", "nonce": 1, "results": [{"outputs": [ref] * 64, "devices": [], "reason": ""}]}
    with pytest.raises(ExecutorProtocolError, match="more than the mailbox"):
        wire.decode_reply(raw, wire.OpResults, 1, box)
    raw["results"][0]["outputs"] = [ref]             # the next reply starts afresh
    assert wire.decode_reply(raw, wire.OpResults, 1, box).results[0].outputs[0].numel() == 3 << 18
    box.close()


def test_candidate_text_comes_back_escaped_and_bounded():
    hostile = "\x1b[2J\x1b[31mroot:x:0:0\n" + "A" * 100_000 + "\u202e"
    reply = wire.decode_reply(_raw(wire.Failed(nonce=5, error=hostile)), wire.Load, 5)
    assert len(reply.error) <= wire.TEXT_CHARS + 30 and "\x1b" not in reply.error and "\n" not in reply.error
    assert reply.error.startswith("\\x1b[2J\\x1b[31mroot:x:0:0\\n")
    many = wire.decode_reply(_raw(wire.GuardsReply(nonce=5, reasons=["r"] * 10_000)), wire.GuardsReply, 5)
    assert len(many.reasons) == wire.TEXT_ITEMS
    loaded = wire.decode_reply(_raw(wire.Loaded(nonce=5, config={"k\x07": ["\x1b" * 5000]})), wire.Loaded, 5)
    (key, value), = loaded.config.items()
    assert key == "k\\x07" and len(value[0]) <= wire.TEXT_CHARS + 30 and "\x1b" not in value[0]
