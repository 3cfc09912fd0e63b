"""``tkcc ui [--board URL] [--host 127.0.0.1] [--port 8800] [--allow-remote [--allowed-host H]]``: the
read-only web UI over a board (see ``compiler/ui``). Binds the loopback interface unless
``--allow-remote`` is given with another host; then every request needs the token (printed at start,
or ``TKCC_UI_TOKEN``) and the Host header must name this machine (compiler/ui/access.py). The
board is checked before anything is served: a path that is not a SQLite database is one line, exit 2.
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
                   help="allow a non-loopback --host; every request then needs the token printed at start "
                        "(or TKCC_UI_TOKEN), as a bearer token or the basic-auth password")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="with --allow-remote: another name the browser may reach this machine by (repeatable)")
    p.set_defaults(func=_ui)


def _ui(args) -> int:
    from compiler.serve.http_server import ServeError
    from persistent_engine import is_loopback

    if not is_loopback(args.host) and not args.allow_remote:
        raise ServeError(f"refusing to serve on non-loopback host {args.host!r}: pass --allow-remote "
                         "(every request then needs a token)")
    url = board_url(args.board)
    from compiler.ui import UIConfig, serve
    from compiler.ui.access import local_access, remote_access
    from compiler.validate import UsageError

    access = remote_access(args.host, tuple(args.allowed_host)) if args.allow_remote else local_access(args.host)
    if access.token is not None:
        print(f"tkcc ui: remote access needs this token (Authorization: Bearer, or the basic-auth password): "
              f"{access.token}", flush=True)
    from sqlalchemy.exc import SQLAlchemyError
    try:
        serve(UIConfig(board=url, access=access), host=args.host, port=args.port)
    except SQLAlchemyError as e:            # a board that cannot be opened (server down, not a board)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UsageError(f"cannot open board {args.board}: {first[:300]}") from None
    return 0
