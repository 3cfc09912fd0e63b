"""Serving the UI with uvicorn: in the foreground (``tkcc ui``) or on a background thread (tests,
the benchmark, screenshots), always on a socket bound before uvicorn starts so that a busy port is
one clear error and port 0 picks a free one.
"""

from __future__ import annotations

import uvicorn

from compiler.serve.http_server import ThreadedServer, bind

from .app import UIConfig, create_app


class UIServer(ThreadedServer):
    """The UI on a background thread: ``with UIServer(UIConfig(board=url)) as s: s.url``."""

    name = "tkcc-ui"

    def __init__(self, config: UIConfig, host: str = "127.0.0.1", port: int = 0):
        super().__init__(create_app(config), host, port)


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
