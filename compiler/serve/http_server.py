"""An ASGI app on a socket bound before uvicorn starts (a busy port is one clear error and port 0 picks
a free one), in the foreground or on a background thread. Shared by the UI and ``tkcc serve``; it
imports no board, so serving needs no SQLAlchemy.
"""

from __future__ import annotations

import socket
import threading
import time

import uvicorn


class ServeError(OSError):
    """A server cannot listen where asked (busy port, a refused host or port): one line, exit 2."""

    user_error = True


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); ``ServeError`` with one line when that fails."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


class ThreadedServer:
    """An ASGI app served by uvicorn on a background thread, on a socket bound first (``bind``):
    ``with Sub(...) as s: s.url``. Subclasses name the thread and their start/stop limits."""

    name = "tkcc-http"
    start_timeout_s = 20.0
    stop_timeout_s = 10.0
    graceful_shutdown_s: float | None = None

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0):
        self.app = app
        self._sock = bind(host, port)
        self.host, self.port = self._sock.getsockname()[:2]
        self.url = f"http://{self.host}:{self.port}"
        self._server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", access_log=False,
                                                     lifespan="on",
                                                     timeout_graceful_shutdown=self.graceful_shutdown_s))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name=self.name, daemon=True)

    def start(self, timeout_s: float | None = None):
        self._thread.start()
        deadline = time.monotonic() + (self.start_timeout_s if timeout_s is None else timeout_s)
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the {self.name} server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=self.stop_timeout_s)
        self._sock.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
