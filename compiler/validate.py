"""Validation of command-line input, shared by every ``tkcc`` command (docs/errors.md).

Numbers: the argparse ``type=`` callables below (``positive_float``, ``count``, ``port``, ...) refuse
NaN, infinities and out-of-range values at parse time, so a flag such as ``--ks nan`` or
``--max-points 0`` never reaches the code that would run silently wrong on it; ``finite_floats``
is the safety net the CLI runs over every parsed float. Files: ``input_file``, ``output_file``,
``output_dir`` and ``board_url`` check the kind of a path (file vs directory, SQLite vs garbage)
before any work starts. Every refusal is a ``UsageError``: one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import Any, Callable

__all__ = ["UsageError", "number", "positive_float", "nonneg_float", "count", "port", "finite_floats",
           "input_file", "output_file", "output_dir", "board_url", "open_board", "SQLITE_MAGIC"]

SQLITE_MAGIC = b"SQLite format 3\x00"           # the first 16 bytes of every SQLite database file
BOARD_SCHEMES = ("sqlite", "postgresql", "postgres", "postgresql+psycopg", "postgresql+psycopg2")


class UsageError(ValueError):
    """Bad input from the user. The CLI prints it as one line, exit 2."""

    user_error = True


# ---------------------------------------------------------------- numbers (argparse ``type=``)
def number(kind: type = float, *, low: float | None = None, high: float | None = None,
           low_open: bool = False) -> Callable[[str], Any]:
    """An argparse type: ``kind(text)`` that is finite and within ``[low, high]`` (``(low, high]``
    with ``low_open``). Its ``__name__`` is what argparse names in the error."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"wants {'an integer' if kind is int else 'a number'}, "
                                             f"got {text!r}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
        if low is not None and (value <= low if low_open else value < low):
            raise argparse.ArgumentTypeError(f"must be {'>' if low_open else '>='} {low:g}, got {text!r}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"must be <= {high:g}, got {text!r}")
        return value
    parse.__name__ = kind.__name__
    return parse


positive_float = number(float, low=0.0, low_open=True)
nonneg_float = number(float, low=0.0)


def count(low: int = 1, high: int | None = None) -> Callable[[str], int]:
    """An integer flag of at least ``low`` (a count of layers, points, GPUs, runs...)."""
    return number(int, low=low, high=high)


port = number(int, low=0, high=65535)


def finite_floats(args: argparse.Namespace) -> None:
    """The safety net over every parsed flag: a float that is NaN or infinite is refused whatever its
    flag's type (a flag added later with a bare ``type=float`` is still covered)."""
    for name, value in vars(args).items():
        if isinstance(value, float) and not math.isfinite(value):
            raise UsageError(f"--{name.replace('_', '-')} must be a finite number, got {value!r}")


# ---------------------------------------------------------------- files
def input_file(path: str | os.PathLike, what: str = "file") -> Path:
    """An existing, readable regular file (not a directory)."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{what} not found: {path}")
    if p.is_dir():
        raise UsageError(f"{what} {path} is a directory, not a file")
    if not os.access(p, os.R_OK):
        raise UsageError(f"{what} {path} is not readable")
    return p


def output_file(path: str | os.PathLike, what: str = "output file") -> Path:
    """A path a file may be written to: not a directory, its parent an existing directory."""
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{what} {path} is a directory, not a file")
    parent = p.parent if str(p.parent) else Path(".")
    if parent.exists() and not parent.is_dir():
        raise UsageError(f"{what} {path}: {parent} is not a directory")
    return p


def output_dir(path: str | os.PathLike, what: str = "--out") -> Path:
    """A directory to write into: absent (it is created) or a directory, never an existing file, and
    no existing file on the way to it."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UsageError(f"{what} {path} is an existing file, not a directory")
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"{what} {path}: {parent} is a file, not a directory")
            if not os.access(parent, os.W_OK):
                raise UsageError(f"{what} {path}: {parent} is not writable")
            break
    return p


def board_url(value: str) -> str:
    """A board URL, checked before anything opens it. A bare path (``out/board.db``) means the SQLite
    file there. A SQLite file must be a SQLite database (or empty, or absent in an existing
    directory); other schemes must be PostgreSQL."""
    value = str(value).strip()
    if not value:
        raise UsageError("--board is empty")
    if "://" not in value:
        value = f"sqlite:///{os.path.abspath(value)}"
    scheme, _, rest = value.partition("://")
    if scheme.lower() not in BOARD_SCHEMES:
        raise UsageError(f"--board {value!r}: unknown scheme {scheme!r} (sqlite:///PATH, postgresql://..., "
                         "or a path to a SQLite file)")
    if scheme.lower() != "sqlite":
        if not rest or rest.startswith("/"):
            raise UsageError(f"--board {value!r}: no host in the PostgreSQL URL")
        return value
    path = rest[1:] if rest.startswith("/") else rest
    if path in ("", ":memory:"):
        return value
    p = Path(path.split("?", 1)[0])
    if p.is_dir():
        raise UsageError(f"--board {p} is a directory, not a SQLite file")
    if p.exists():
        try:
            with open(p, "rb") as f:
                head = f.read(len(SQLITE_MAGIC))
        except OSError as e:
            raise UsageError(f"--board {p}: cannot read it ({e.strerror})") from None
        if head and head != SQLITE_MAGIC:
            raise UsageError(f"--board {p} is not a SQLite database")
    elif not p.parent.is_dir():
        raise UsageError(f"--board {p}: directory {p.parent} does not exist")
    return value


def open_board(url: str) -> Any:
    """``bulletin_board.Board(url)`` with a connection or schema failure as one line (exit 2): a
    PostgreSQL server that is down, a database that refuses the login, a file that is not a board."""
    from bulletin_board import Board

    try:
        return Board(url)
    except Exception as e:  # noqa: BLE001 - any failure to open the user's board is input, not a bug
        if getattr(e, "user_error", False):
            raise
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UsageError(f"cannot open board {_redacted(url)}: {first[:300]}") from None


def _redacted(url: str) -> str:
    """A URL without its password (``postgresql://user:***@host/db``)."""
    scheme, sep, rest = url.partition("://")
    if "@" in rest and ":" in rest.split("@", 1)[0]:
        user = rest.split("@", 1)[0].split(":", 1)[0]
        rest = f"{user}:***@{rest.split('@', 1)[1]}"
    return f"{scheme}{sep}{rest}"
