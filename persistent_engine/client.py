"""``EngineClient``: typed calls to one engine over zmq, with a per-call timeout.

Each call sends one request frame on a REQ socket and polls for the reply in short slices, asking
``alive()`` (the supervisor passes "is the engine process still running?") between slices, so a
crashed engine is noticed in ~50 ms rather than at the end of the timeout. After a timeout or a
death the socket is in a broken REQ state; it is thrown away and a fresh one is made on the next
call. Stdlib + pyzmq + msgpack only.

Every socket authenticates in the ZeroMQ PLAIN handshake (user ``PLAIN_USER``, password the token) before
any request goes out; a socket monitor sees the engine refuse that handshake (wrong token), and the call
answers ``ErrorReply(kind="auth")`` at once instead of waiting out its timeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import zmq
from zmq.utils.monitor import recv_monitor_message

from persistent_engine.io_struct import (PLAIN_USER, Bench, ErrorReply, BenchReply, LoadCandidate, LoadReply, Prepare, PrepareReply,
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


HANDSHAKE_REFUSED = (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                     | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)


def authenticate(sock: zmq.Socket, token: str) -> None:
    """Give a socket the engine's PLAIN credentials (before ``connect``); every peer of an engine needs them."""
    sock.setsockopt_string(zmq.PLAIN_USERNAME, PLAIN_USER)
    sock.setsockopt_string(zmq.PLAIN_PASSWORD, token)


class EngineClient:
    def __init__(self, address: str, token: str, timeout_s: float = 600.0,
                 alive: Callable[[], bool] | None = None):
        self.address = address
        self.timeout_s = timeout_s
        self._token = token
        self._alive = alive
        self._ctx = zmq.Context.instance()
        self._sock: zmq.Socket | None = None
        self._monitor: zmq.Socket | None = None     # handshake events of ``_sock``

    # ------------------------------------------------------------------------------ transport
    def _socket(self) -> zmq.Socket:
        if self._sock is None:
            s = self._ctx.socket(zmq.REQ)
            s.setsockopt(zmq.LINGER, 0)
            authenticate(s, self._token)
            self._monitor = s.get_monitor_socket(HANDSHAKE_REFUSED)
            s.connect(self.address)
            self._sock = s
        return self._sock

    def _reset(self) -> None:
        if self._sock is not None:
            self._sock.disable_monitor()
            self._monitor.close(0)
            self._sock.close(0)
            self._sock, self._monitor = None, None

    def _handshake_refused(self) -> bool:
        """Whether the engine refused this socket's handshake (a wrong token) since the last look."""
        refused = False
        while self._monitor.poll(0, zmq.POLLIN):
            refused |= bool(recv_monitor_message(self._monitor)["event"] & HANDSHAKE_REFUSED)
        return refused

    def send_raw(self, frame: bytes, timeout_s: float | None = None) -> bytes:
        """Send any bytes (tests use it for hostile frames) and return the raw reply frame. The send
        itself waits for the handshake (a REQ socket holds a message until a peer is authenticated)."""
        sock = self._socket()
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        refused = self._wait(sock, zmq.POLLOUT, deadline, timeout_s)
        if refused is not None:
            return refused
        sock.send(frame, zmq.NOBLOCK)
        refused = self._wait(sock, zmq.POLLIN, deadline, timeout_s)
        return sock.recv() if refused is None else refused

    def _wait(self, sock: zmq.Socket, event: int, deadline: float, timeout_s: float | None) -> bytes | None:
        """Poll ``sock`` for ``event`` in 50 ms slices until the deadline: None when ready, an encoded
        ``ErrorReply(kind="auth")`` when the engine refused the handshake; raises on timeout or death."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self._reset()
                raise EngineTimeout(f"engine did not answer within {timeout_s or self.timeout_s:.1f} s")
            if sock.poll(int(min(left, 0.05) * 1000) + 1, event):
                return None
            if self._handshake_refused():
                self._reset()
                return encode(ErrorReply(message="the engine refused the handshake: missing or wrong token",
                                         kind="auth"))
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

    def prepare(self, timeout_s: float | None = None, sources: list[str] | None = None) -> PrepareReply:
        return self.call(Prepare(token=self._token, sources=list(sources or [])), timeout_s)

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
