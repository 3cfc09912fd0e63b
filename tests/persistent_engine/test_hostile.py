"""1,000 hostile messages against a real engine process: each gets an error reply, none kills it."""

import os
import random

import msgpack
import pytest
import zmq

from persistent_engine import io_struct as io
from persistent_engine.client import authenticate
from persistent_engine.supervisor import Supervisor


@pytest.fixture(scope="module")
def engine():
    sup = Supervisor("tiny-dense", device="cpu", start_timeout_s=300)
    sup.start()
    yield sup
    sup.close()


def _hostile_frames(token: str, n: int, rng: random.Random):
    kinds = ["random", "msgpack_scalar", "no_token", "wrong_token", "unknown_type", "bad_field",
             "extra_field", "nested", "truncated", "too_large_small"]
    for i in range(n):
        k = kinds[i % len(kinds)]
        if k == "random":
            yield k, os.urandom(rng.randrange(0, 300))
        elif k == "msgpack_scalar":
            yield k, msgpack.packb(rng.choice([1, "status", None, [1, 2], 3.5, True, b"\x00"]))
        elif k == "no_token":
            yield k, msgpack.packb({"type": rng.choice(list(io.REQUESTS))})
        elif k == "wrong_token":
            yield k, msgpack.packb({"type": "shutdown", "token": token[:-1] + ("0" if token[-1] != "0" else "1")})
        elif k == "unknown_type":
            yield k, msgpack.packb({"type": rng.choice(["exec", "", "STATUS", 5]), "token": token})
        elif k == "bad_field":
            yield k, msgpack.packb({"type": "bench", "token": token, "samples": rng.choice(["9", 1.5, [1], None])})
        elif k == "extra_field":
            yield k, msgpack.packb({"type": "status", "token": token, "__class__": "x"})
        elif k == "nested":
            yield k, msgpack.packb({"type": "load_candidate", "token": token, "source": {"a": [1] * 10}})
        elif k == "truncated":
            yield k, io.encode(io.Status(token=token))[:-3]
        else:
            yield k, msgpack.packb({"type": "load_candidate", "token": token, "source": "#" * (9 << 20)})


def test_thousand_hostile_messages_get_error_replies_and_the_engine_keeps_serving(engine):
    token = engine._token
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    authenticate(sock, token)
    sock.connect(engine.client.address)
    kinds = {}
    rng = random.Random(7)
    frames = list(_hostile_frames(token, 998, rng))
    frames.append(("huge_100MB", msgpack.packb({"type": "load_candidate", "token": token,
                                                "source": "x" * (100 * 1024 * 1024)})))
    frames.append(("huge_100MB_no_token", os.urandom(1024) * (100 * 1024)))
    assert len(frames) == 1000
    for kind, frame in frames:
        sock.send(frame)
        assert sock.poll(30_000), f"no reply to a {kind} frame"
        reply = io.decode_reply(sock.recv())
        assert isinstance(reply, io.ErrorReply) and not reply.ok and reply.message, (kind, reply)
        kinds.setdefault(kind, set()).add(reply.kind)
    sock.close(0)
    assert kinds["wrong_token"] == {"auth"} and kinds["no_token"] == {"auth"}
    assert kinds["huge_100MB"] == {"too_large"} and kinds["too_large_small"] == {"too_large"}
    assert kinds["bad_field"] == {"protocol"} and kinds["unknown_type"] == {"protocol"}
    assert engine.alive()
    status = engine.client.status(timeout_s=30)
    assert status.ok and status.model == "tiny-dense"
    assert status.served == 0                   # no hostile frame reached the engine
    assert engine.client.status(timeout_s=30).served == 1
