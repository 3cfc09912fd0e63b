"""``tkcc engine serve --model M --layers N [--device D] [--port P]``: one engine over RPC.

A thin front for ``python -m persistent_engine serve`` (same flags, same JSON lines on stdout):
prints each start-up stage, then ``{"ready": true, "port", "token_file", ...}``, and serves
until a ``shutdown`` request. Binds 127.0.0.1 unless ``--host`` and ``--allow-remote`` say otherwise.
"""

from __future__ import annotations

from compiler.validate import port


def register(subparsers) -> None:
    p = subparsers.add_parser("engine", help="run a persistent engine")
    sub = p.add_subparsers(dest="engine_command", metavar="{serve}")
    sub.required = True
    s = sub.add_parser("serve", help="build the model slice once and serve candidates over RPC")
    s.add_argument("--model", required=True, help="model alias or config.json path")
    s.add_argument("--tiny", action="store_true", help="the model's architecture at toy size (every feature kept)")
    s.add_argument("--layers", default=None, help="N (first N layers) or i,j,k (default: fast tier)")
    s.add_argument("--device", default="cpu")
    s.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    s.add_argument("--port", type=port, default=0, help="0: any free port (printed when ready)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--allow-remote", action="store_true", help="allow a non-loopback --host")
    s.add_argument("--token-file", default=None, help="write the token here (mode 0600)")
    s.add_argument("--points", default=None, help="workload points: JSON list or file")
    s.set_defaults(func=serve)


def serve(args) -> int:
    from persistent_engine import engine_main as main
    from persistent_engine.models.spec import tiny_name

    argv = ["serve", "--model", tiny_name(args.model, args.tiny), "--device", args.device, "--dtype", args.dtype,
            "--port", str(args.port), "--host", args.host]
    for flag, value in (("--layers", args.layers), ("--token-file", args.token_file),
                        ("--points", args.points)):
        if value is not None:
            argv += [flag, value]
    if args.allow_remote:
        argv.append("--allow-remote")
    return main(argv)
