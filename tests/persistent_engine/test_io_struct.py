"""Typed messages and their msgpack frames: round trips, and every malformed frame is a ProtocolError."""

import msgpack
import pytest

from persistent_engine import io_struct as io


@pytest.mark.parametrize("msg", [
    io.LoadCandidate(token="t", source="OVERRIDES = {}", name="c1"),
    io.Verify(token="t", seed=5), io.Verify(token="t"), io.Bench(token="t", samples=9, warmup=2),
    io.Unload(token="t"), io.Profile(token="t"), io.Status(token="t"), io.Shutdown(token="t"),
])
def test_requests_round_trip(msg):
    assert io.decode_request(io.encode(msg)) == msg


@pytest.mark.parametrize("msg", [
    io.ErrorReply(message="bad", kind="auth"),
    io.LoadReply(ops=["rms_norm"], config={"cuda_graph": True}, reasons=[], seconds=0.1),
    io.VerifyReply(ok=False, reasons=["x"], checks=[{"name": "op:rms_norm", "passed": False, "detail": "x"}]),
    io.BenchReply(per_point=[{"label": "decode b1", "speedup": 1.2}], speedup=1.2, timer="cuda_events"),
    io.BenchReply(speedup=None), io.ProfileReply(per_point=[{"ops": {}}]),
    io.StatusReply(model="tiny-dense", layers=[0, 1], startup={"weights": 0.1}, candidate=None, pid=3),
])
def test_replies_round_trip_and_carry_ok_and_message(msg):
    back = io.decode_reply(io.encode(msg))
    assert back == msg
    raw = msgpack.unpackb(io.encode(msg))
    assert {"ok", "message", "type"} <= set(raw)


@pytest.mark.parametrize("frame", [
    b"", b"\xc1", b"garbage", msgpack.packb([1, 2]), msgpack.packb({"type": "nope", "token": "t"}),
    msgpack.packb({"token": "t"}), msgpack.packb({"type": "verify", "token": "t", "seed": "x"}),
    msgpack.packb({"type": "verify", "token": "t", "seed": True}),
    msgpack.packb({"type": "bench", "token": "t", "samples": 1.5}),
    msgpack.packb({"type": "load_candidate", "token": "t", "source": b"bytes"}),
    msgpack.packb({"type": "status", "token": "t", "extra": 1}),
    msgpack.packb({1: 2}), msgpack.packb({"type": "status", "token": 7}) + b"trailing",
])
def test_malformed_request_frames_raise_protocol_error(frame):
    with pytest.raises(io.ProtocolError):
        io.decode_request(frame)


def test_int_is_accepted_where_float_is_declared():
    reply = io.decode_reply(msgpack.packb({"type": "bench", "ok": True, "message": "", "speedup": 2}))
    assert isinstance(reply.speedup, float) and reply.speedup == 2.0


def test_oversize_containers_are_refused_while_decoding():
    with pytest.raises(io.ProtocolError):
        io.decode_request(msgpack.packb({"type": "status", "token": "t", "x": list(range(200_000))}))
