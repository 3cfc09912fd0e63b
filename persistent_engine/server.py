"""The engine's RPC server: one zmq ROUTER socket, msgpack frames, a token on every request.

Security model (the engine runs untrusted candidate code, so the socket must not widen that):
  * binds 127.0.0.1 unless ``allow_remote`` is set; a non-loopback host without it is refused;
  * a token made at start (``secrets.token_hex``) is handed over through a 0600 file or the
    environment (``TKCC_ENGINE_TOKEN``); it is checked twice:
      - in the transport handshake: ZeroMQ PLAIN (user ``PLAIN_USER``, password the token) with a ZAP
        handler (``zmq.auth.thread.ThreadAuthenticator``), so a peer without it is disconnected before
        zmq queues any message of its; before that only its handshake commands are read, each one
        frame of at most ``zmq.MAXMSGSIZE``;
      - on every request (constant-time compare), a second layer;
  * a frame over ``max_bytes`` gets an ``ErrorReply(kind="too_large")`` without being decoded;
    zmq drops frames over 256 MiB at the transport (the peer is disconnected);
  * a message of more than ``MAX_FRAMES`` frames (routing id, delimiter, body), or whose frames
    together exceed ``max_bytes`` + ``ENVELOPE_BYTES``, is answered ``protocol`` / ``too_large``
    before its token is looked at, without a copy of its frames (they are released at once); at
    most ``RCVHWM`` messages wait in the socket (docs/errors.md lists these limits);
  * anything malformed gets an ``ErrorReply`` and the loop goes on; a handler exception too.

Requests are served one at a time on the calling (main) thread: CUDA graphs, the thread-count guard
and the watchdog all assume the engine does one thing at a time.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

import zmq
from zmq.auth.thread import ThreadAuthenticator

from persistent_engine.io_struct import (MAX_REQUEST_BYTES, PLAIN_USER, ErrorReply, ProtocolError, Reply, Request,
                                         Shutdown, ShutdownReply, build_request, encode, unpack_request)

TOKEN_ENV = "TKCC_ENGINE_TOKEN"
# frames up to this size are read and answered with an error when over ``max_bytes``; bigger ones
# are dropped by zmq at the transport (the peer is disconnected) so one frame cannot exhaust memory
TRANSPORT_LIMIT_BYTES = 256 * 1024 * 1024
MAX_FRAMES = 3                  # routing id + empty delimiter (REQ peers) + one request body
ENVELOPE_BYTES = 4096           # routing id and delimiter
RCVHWM = 4                      # messages queued in the socket before zmq stops reading peers


class BindRefused(ValueError):
    """A non-loopback bind without ``allow_remote`` (CLI: one line, exit 2)."""

    user_error = True


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def make_token() -> str:
    return secrets.token_hex(32)


def write_token_file(token: str, path: str | None = None) -> str:
    """Write the token to a file only the owner can read (0600), atomically; returns the path."""
    if path is None:
        fd, path = tempfile.mkstemp(prefix="tkcc-engine-", suffix=".token")
        os.close(fd)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".token-")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def read_token_file(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 0                   # 0: a free port chosen by zmq
    allow_remote: bool = False
    max_bytes: int = MAX_REQUEST_BYTES


class EngineServer:
    """Binds at construction (so a refused bind fails before any model is built) and serves
    ``handler(request) -> reply`` until a ``Shutdown`` request or ``stop()``."""

    def __init__(self, token: str, config: ServerConfig = ServerConfig()):
        if not config.allow_remote and not is_loopback(config.host):
            raise BindRefused(f"refusing to bind {config.host!r}: not a loopback address "
                              "(pass --allow-remote to serve other machines)")
        if not token:
            raise ValueError("the engine needs a non-empty token")
        self.config = config
        self._token = token.encode()
        self._ctx = zmq.Context()
        # the ZAP handler: one daemon thread, started before the engine snapshots its threads
        self._auth = ThreadAuthenticator(self._ctx)
        self._auth.start()
        self._auth.configure_plain(domain="*", passwords={PLAIN_USER: token})
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.PLAIN_SERVER, 1)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, max(TRANSPORT_LIMIT_BYTES, 4 * config.max_bytes))
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        self._sock.setsockopt(zmq.RCVHWM, RCVHWM)
        try:
            self._bind(config)
        except BaseException:
            self.close()
            raise
        endpoint = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.port = int(endpoint.rsplit(":", 1)[1])
        self.address = f"tcp://{'127.0.0.1' if is_loopback(config.host) else config.host}:{self.port}"
        self.served = 0
        self._running = False

    def _bind(self, config: ServerConfig) -> None:
        host = config.host
        if not is_loopback(host) and host not in ("*", "0.0.0.0"):
            host = socket.gethostbyname(host)
        self._sock.bind(f"tcp://{host}:{config.port}")

    # ------------------------------------------------------------------------------ one frame
    def handle_frame(self, frame: bytes, handler: Callable[[Request], Reply]) -> tuple[Reply, bool]:
        """Turn one request frame into a reply; never raises. Returns (reply, stop)."""
        if len(frame) > self.config.max_bytes:
            return ErrorReply(message=f"request of {len(frame)} bytes exceeds the limit of "
                                      f"{self.config.max_bytes} bytes", kind="too_large"), False
        try:
            obj = unpack_request(frame)
        except ProtocolError as e:
            return ErrorReply(message=str(e), kind="protocol"), False
        tok = obj.get("token")
        if not isinstance(tok, str) or not hmac.compare_digest(tok.encode(), self._token):
            return ErrorReply(message="missing or wrong token", kind="auth"), False
        try:
            request = build_request(obj)
        except ProtocolError as e:
            return ErrorReply(message=str(e), kind="protocol"), False
        if isinstance(request, Shutdown):
            return ShutdownReply(message="shutting down"), True
        try:
            reply = handler(request)
        except Exception as e:  # noqa: BLE001 - the server outlives any request
            return ErrorReply(message=f"{type(e).__name__}: {e}"[:2000], kind="internal"), False
        self.served += 1
        return reply, False

    # ------------------------------------------------------------------------------ the loop
    def serve(self, handler: Callable[[Request], Reply],
              after_reply: Callable[[Reply], bool] | None = None,
              keep_going: Callable[[], bool] | None = None) -> None:
        """``after_reply(reply) -> stop`` runs once the reply is sent (the engine exits there when a
        device error poisoned its CUDA context, so that the supervisor starts a fresh one).
        ``keep_going()`` is asked about once a second while idle (the engine stops when the
        supervisor that started it is gone, instead of lingering as an orphan)."""
        self._running = True
        while self._running:
            if keep_going is not None and not self._sock.poll(1000, zmq.POLLIN):
                if not keep_going():
                    break
                continue
            try:
                envelope, body, refused = self.read_message()
            except zmq.ZMQError as e:
                if e.errno in (zmq.ETERM, zmq.ENOTSOCK):
                    break
                continue
            if envelope is None:
                continue
            if refused is not None:
                reply, stop = refused, False
            else:
                reply, stop = self.handle_frame(body, handler)
            try:
                self._sock.send_multipart(envelope + [encode(reply)])
            except zmq.ZMQError:
                pass                            # the peer went away; keep serving
            if after_reply is not None and after_reply(reply):
                stop = True
            if stop:
                break
        self.close()

    def read_message(self) -> tuple[list[bytes] | None, bytes, ErrorReply | None]:
        """One message off the socket: (envelope to reply to, request body, refusal or None). The
        frame count and the total size are checked on zmq's own buffers (``copy=False``) before
        anything is copied, decoded or authenticated; a refused message's frames are dropped."""
        frames = self._sock.recv_multipart(copy=False)
        if not frames:
            return None, b"", None
        envelope = [frames[0].bytes[:ENVELOPE_BYTES]]
        rest = frames[1:]
        if rest and len(rest[0]) == 0:          # REQ peers put an empty delimiter first
            envelope.append(b"")
            rest = rest[1:]
        total = sum(len(f) for f in frames)
        if len(frames) > MAX_FRAMES or len(rest) != 1:
            refused = ErrorReply(message=f"expected one request frame, got {len(rest)} "
                                         f"(at most {MAX_FRAMES} frames with the envelope)", kind="protocol")
        elif total > self.config.max_bytes + ENVELOPE_BYTES:
            refused = ErrorReply(message=f"request of {total} bytes exceeds the limit of "
                                         f"{self.config.max_bytes} bytes", kind="too_large")
        else:
            return envelope, rest[0].bytes, None
        del frames, rest
        return envelope, b"", refused

    def stop(self) -> None:
        self._running = False

    def close(self) -> None:
        self._sock.close(0)
        self._auth.stop()
        self._ctx.term()
