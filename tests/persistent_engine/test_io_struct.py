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


POINT = io.WorkloadPoint("decode", 4, 64, 1, 0.5)


@pytest.mark.parametrize("msg", [
    io.ErrorReply(message="bad", kind="auth"),
    io.LoadReply(ops=["rms_norm"], config={"cuda_graph": True}, reasons=[], seconds=0.1),
    io.VerifyReply(ok=False, reasons=["x"], checks=[io.Check("op:rms_norm", False, "x")]),
    io.BenchReply(per_point=[io.PointTiming(POINT, "decode b1", True, 2.0, 1.0, 2.0, speedup_q1=1.8,
                                            config={"max_num_seqs": "applied"})], speedup=1.2, timer="cuda_events"),
    io.BenchReply(speedup=None),
    io.ProfileReply(per_point=[io.PointProfile(POINT, "decode b1", 1.0, 0.9, {"linear": {"ms": 0.9, "calls": 2}})]),
    io.StatusReply(model="tiny-dense", points=[POINT], startup={"weights": 0.1}),
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
    reply = io.decode_reply(msgpack.packb({"type": "bench", "v": io.WIRE_VERSION, "ok": True, "message": "", "speedup": 2}))
    assert isinstance(reply.speedup, float) and reply.speedup == 2.0


def test_oversize_containers_are_refused_while_decoding():
    with pytest.raises(io.ProtocolError):
        io.decode_request(msgpack.packb({"type": "status", "token": "t", "x": list(range(200_000))}))


def test_value_types_travel_as_field_lists_and_come_back_typed():
    """A bench reply's per-point timings are lists of fields on the wire (no keys: compact), typed again
    on decode; a frame of another wire version is refused."""
    msg = io.BenchReply(per_point=[io.PointTiming(POINT, POINT.label(), True, 2.0, 1, 2.0)], speedup=2.0)
    raw = msgpack.unpackb(io.encode(msg))
    assert raw["v"] == io.WIRE_VERSION and isinstance(raw["per_point"][0], list)
    assert raw["per_point"][0][0] == ["decode", 4, 64, 1, 0.5]
    back = io.decode_reply(io.encode(msg))
    assert isinstance(back.per_point[0].point, io.WorkloadPoint) and back.per_point[0].candidate_ms == 1.0
    assert isinstance(back.per_point[0].candidate_ms, float)
    with pytest.raises(io.ProtocolError, match="wire version"):
        io.decode_reply(msgpack.packb({**raw, "v": 1}))
    with pytest.raises(io.ProtocolError, match="per_point"):
        io.decode_reply(msgpack.packb({**raw, "per_point": [[1, 2]]}))


def test_one_point_label_and_key():
    p = io.WorkloadPoint("prefill", 1, 0, 512, 0.25)
    assert p.label() == "prefill b1 ctx0 chunk512" and p.label(weighted=True) == "prefill b1 ctx0 chunk512 (25%)"
    assert io.point_label({"phase": "decode", "batch": 8, "context": 1024}) == "decode b8 ctx1024"
    assert p.key == io.point_key({**p.to_dict(), "fast": 1.2}) == ("prefill", 1, 0, 512)
    assert io.WorkloadPoint.from_dict(p.to_dict()) == p


def test_engine_cli_points_become_typed_at_the_boundary(tmp_path):
    from persistent_engine.__main__ import parse_points

    f = tmp_path / "points.json"
    f.write_text('[{"phase": "prefill", "batch": 1, "context": 0, "chunk": 16, "weight": 0.2}, {"phase": "decode", "batch": 3}]')
    assert parse_points(str(f)) == [io.WorkloadPoint("prefill", 1, 0, 16, 0.2), io.WorkloadPoint("decode", 3)]
    assert parse_points(None) == []
    with pytest.raises(ValueError, match="bad workload point"):
        parse_points('[{"phase": "decode", "batch": "x"}]')
