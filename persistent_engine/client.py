"""``EngineClient``: typed calls to one engine over zmq, with a per-call timeout.

Each call sends one request frame on a REQ socket and polls for the reply in short slices, asking
``alive()`` (the supervisor passes "is the engine process still running?") between slices, so a
crashed engine is noticed in ~50 ms rather than at the end of the timeout. After a timeout or a
death the socket is in a broken REQ state; it is thrown away and a fresh one is made on the next
call. Stdlib + pyzmq + msgpack only.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import zmq

from persistent_engine.io_struct import (Bench, BenchReply, LoadCandidate, LoadReply, Prepare, PrepareReply,
                                         Profile, ProfileReply, Reply, Request, Shutdown, Status, StatusReply,
                                         Unload, UnloadReply, Verify, VerifyReply, decode_reply, encode)


class EngineTimeout(TimeoutError):
    """The engine did not answer within the call's timeout (a hang: the watchdog fires)."""


class EngineDied(RuntimeError):
    """The engine process ended while a call was waiting for it."""


def _inner(timeout_s: float | None) -> float:
    """The judge's own watchdog on the executor: a little inside the caller's timeout, so the judge kills a
    hung executor and answers before the caller gives up on the judge (0: the judge's default)."""
    if timeout_s is None:
        return 0.0
    return max(0.2, min(timeout_s - 1.0, 0.9 * timeout_s))


class EngineClient:
    def __init__(self, address: str, token: str, timeout_s: float = 600.0,
                 alive: Callable[[], bool] | None = None):
        self.address = address
        self.timeout_s = timeout_s
        self._token = token
        self._alive = alive
        self._ctx = zmq.Context.instance()
        self._sock: zmq.Socket | None = None

    # ------------------------------------------------------------------------------ transport
    def _socket(self) -> zmq.Socket:
        if self._sock is None:
            s = self._ctx.socket(zmq.REQ)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(self.address)
            self._sock = s
        return self._sock

    def _reset(self) -> None:
        if self._sock is not None:
            self._sock.close(0)
            self._sock = None

    def send_raw(self, frame: bytes, timeout_s: float | None = None) -> bytes:
        """Send any bytes (tests use it for hostile frames) and return the raw reply frame."""
        sock = self._socket()
        sock.send(frame)
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self._reset()
                raise EngineTimeout(f"engine did not answer within {timeout_s or self.timeout_s:.1f} s")
            if sock.poll(int(min(left, 0.05) * 1000) + 1, zmq.POLLIN):
                return sock.recv()
            if self._alive is not None and not self._alive():
                self._reset()
                raise EngineDied("engine process ended during the call")

    def call(self, request: Request, timeout_s: float | None = None) -> Reply:
        return decode_reply(self.send_raw(encode(request), timeout_s))

    # ------------------------------------------------------------------------------ typed calls
    def load_candidate(self, source: str, name: str = "candidate",
                       timeout_s: float | None = None) -> LoadReply:
        return self.call(LoadCandidate(token=self._token, source=source, name=name,
                                       timeout_s=_inner(timeout_s)), timeout_s)

    def prepare(self, timeout_s: float | None = None) -> PrepareReply:
        return self.call(Prepare(token=self._token), timeout_s)

    def verify(self, seed: int | None = None, timeout_s: float | None = None) -> VerifyReply:
        return self.call(Verify(token=self._token, seed=seed, timeout_s=_inner(timeout_s)), timeout_s)

    def bench(self, samples: int = 0, warmup: int = 0, timeout_s: float | None = None) -> BenchReply:
        return self.call(Bench(token=self._token, samples=samples, warmup=warmup, timeout_s=_inner(timeout_s)),
                         timeout_s)

    def unload(self, timeout_s: float | None = None) -> UnloadReply:
        return self.call(Unload(token=self._token), timeout_s)

    def profile(self, timeout_s: float | None = None) -> ProfileReply:
        return self.call(Profile(token=self._token), timeout_s)

    def status(self, timeout_s: float | None = None) -> StatusReply:
        return self.call(Status(token=self._token), timeout_s)

    def shutdown(self, timeout_s: float | None = None) -> Reply:
        return self.call(Shutdown(token=self._token), timeout_s)

    def close(self) -> None:
        self._reset()
