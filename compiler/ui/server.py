"""Serving the UI with uvicorn: in the foreground (``tkcc ui``) or on a background thread (tests,
the benchmark, screenshots), always on a socket bound before uvicorn starts so that a busy port is
one clear error and port 0 picks a free one.
"""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

from .app import UIConfig, create_app


class ServeError(OSError):
    """The UI cannot listen where asked (busy port, remote host without --allow-remote)."""

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


class UIServer:
    """The UI on a background thread: ``with UIServer(UIConfig(board=url)) as s: s.url``."""

    def __init__(self, config: UIConfig, host: str = "127.0.0.1", port: int = 0):
        self.app = create_app(config)
        self._sock = bind(host, port)
        self.host, self.port = self._sock.getsockname()[:2]
        self.url = f"http://{self.host}:{self.port}"
        self._server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", access_log=False,
                                                     lifespan="on"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name="tkcc-ui", daemon=True)

    def start(self, timeout_s: float = 20.0) -> "UIServer":
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the UI server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()

    def __enter__(self) -> "UIServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def serve(config: UIConfig, host: str = "127.0.0.1", port: int = 8800) -> None:
    """Serve in the foreground until Ctrl-C."""
    app = create_app(config)
    sock = bind(host, port)
    h, p = sock.getsockname()[:2]
    print(f"tkcc ui: serving {app.state.board.url} (read-only) at http://{h}:{p}/  (Ctrl-C stops)",
          flush=True)
    try:
        uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on")).run(sockets=[sock])
    finally:
        sock.close()
