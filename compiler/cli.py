"""The ``tkcc`` command line. Each command group lives in its own ``compiler/commands/*.py`` module with
``register(subparsers)``; modules keep heavy imports (torch, pandas) inside their handlers so that
``tkcc --help`` stays instant.

Exit codes (DESIGN.md): 0 success, 1 a negative verdict, 2 usage or input error. An exception that
carries ``user_error = True`` (bad trace, unknown model or hardware, corrupt plan) becomes one line
on stderr and exit 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

COMMAND_MODULES = [
    "compiler.commands.optimize",     # optimize, recompile, plan
    "compiler.commands.traffic",      # traffic profile | diff
    "compiler.commands.parallelism",  # parallelism
    "compiler.commands.cost",         # cost op
    "compiler.commands.candidate",    # candidate check, ops
    "compiler.commands.engine",       # engine serve
    "compiler.commands.ui",           # ui
    "compiler.commands.doctor",       # doctor
    "compiler.commands.serve",        # serve, bench serve
]


class Parser(argparse.ArgumentParser):
    """argparse with its usage errors as one line (``tkcc optimize: error: ...``), exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("tkcc")
    except metadata.PackageNotFoundError:
        return "unknown (not installed: run make install)"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="tkcc", description="tkcc: a continuous compiler for LLM inference")
    parser.add_argument("--version", action="version", version=f"tkcc {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def is_user_error(e: BaseException) -> bool:
    return bool(getattr(e, "user_error", False)) or isinstance(
        e, (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError))


def main(argv: list[str] | None = None) -> int:
    from compiler.validate import finite_floats

    args = build_parser().parse_args(argv)
    try:
        finite_floats(args)
        rc = args.func(args)
    except KeyboardInterrupt:
        print("tkcc: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the CLI boundary turns errors into exit codes
        if os.environ.get("TKCC_DEBUG"):
            raise
        if is_user_error(e):
            msg = str(e) if not isinstance(e, OSError) or not e.filename else f"{e.strerror}: {e.filename}"
            print(f"tkcc: error: {msg}", file=sys.stderr)
            return 2
        print(f"tkcc: internal error: {type(e).__name__}: {e} (TKCC_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        return 3
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
