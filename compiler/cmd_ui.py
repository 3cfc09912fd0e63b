"""``tkcc ui [--board URL] [--host 127.0.0.1] [--port 8800] [--allow-remote]``: the read-only web UI
over a board (see ``compiler/ui``). Binds the loopback interface unless ``--allow-remote`` is given
with another host: the board holds LLM-written code and the UI has no authentication.
"""

from __future__ import annotations

from compiler.validate import board_url, port


def register(subparsers) -> None:
    p = subparsers.add_parser("ui", help="serve the read-only web UI over a board")
    p.add_argument("--board", default="sqlite:///tkcc.db",
                   help="board URL or SQLite file (default sqlite:///tkcc.db)")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    p.add_argument("--port", type=port, default=8800, help="port (default 8800; 0 picks a free one)")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow a non-loopback --host (the UI has no authentication)")
    p.set_defaults(func=_ui)


def _ui(args) -> int:
    from compiler.ui.server import ServeError
    from persistent_engine.server import is_loopback

    if not is_loopback(args.host) and not args.allow_remote:
        raise ServeError(f"refusing to serve on non-loopback host {args.host!r}: the UI has no "
                         "authentication; pass --allow-remote to do it anyway")
    if not 0 <= args.port <= 65535:
        raise ServeError(f"--port must be 0..65535, not {args.port}")
    from compiler.ui import UIConfig, serve

    serve(UIConfig(board=board_url(args.board)), host=args.host, port=args.port)
    return 0
