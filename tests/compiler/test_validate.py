"""Every numeric flag is finite and in range and every file argument of the right kind, checked before
any work starts (issue 21): one line on stderr, exit 2, never an "internal error" (exit 3)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

from compiler import validate
from compiler.cli import main

ROOT = Path(__file__).resolve().parents[2]
CONV = str(ROOT / "examples" / "traffic" / "azure2023_conv.csv")
CODE = str(ROOT / "examples" / "traffic" / "azure2023_code.csv")
OPT = ["optimize", "--model", "tiny-dense", "--hw", "h200", "--traffic", CONV]


@pytest.fixture
def files(tmp_path):
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"\x89PNG not a database" * 50)
    binary = tmp_path / "model.bin"
    binary.write_bytes(bytes(range(256)) * 64)
    existing = tmp_path / "a_file"
    existing.write_text("x")
    return {"GARBAGE": str(garbage), "BINARY": str(binary), "FILE": str(existing), "DIR": str(tmp_path)}


CASES = [
    (["traffic", "diff", CONV, CODE, "--ks", "nan"], "finite"),
    (["traffic", "diff", CONV, CODE, "--ks", "-1"], ">= 0"),
    (["traffic", "diff", CONV, CONV, "--wasserstein", "inf"], "finite"),
    (["traffic", "diff", "DIR", CONV], "is a directory"),
    (["traffic", "profile", CONV, "--out", "DIR"], "is a directory"),
    (["traffic", "profile", CONV, "--workload", "--model", "tiny-dense", "--time-scale", "nan"], "finite"),
    (["traffic", "profile", CONV, "--lru-blocks", "0"], ">= 1"),
    (["parallelism", "--model", "tiny-dense", "--hw", "h200", "--gpus", "1", "--tpot-ms", "nan"], "finite"),
    (["parallelism", "--model", "tiny-dense", "--hw", "h200", "--gpus", "1", "--ttft-ms", "-5"], "> 0"),
    (["parallelism", "--model", "tiny-dense", "--hw", "h200", "--gpus", "0"], ">= 1"),
    (["parallelism", "--model", "BINARY", "--hw", "h200", "--gpus", "1"], "not a text file"),
    (["parallelism", "--model", "tiny-dense", "--hw", "h200", "--gpus", "1", "--traffic", "DIR"], "is a directory"),
    (OPT + ["--max-points", "0"], ">= 1"),
    (OPT + ["--budget", "0"], "more than 0"),
    (OPT + ["--budget", "0s"], "more than 0"),
    (OPT + ["--budget", "nan"], "bad duration"),
    (OPT + ["--timeout", "-1"], "> 0"),
    (OPT + ["--timeout", "nan"], "finite"),
    (OPT + ["--tpot-ms", "0"], "> 0"),
    (OPT + ["--ttft-ms", "nan"], "finite"),
    (OPT + ["--fast-layers", "0"], ">= 1"),
    (OPT + ["--slow-layers", "-2"], ">= 1"),
    (OPT + ["--aa-runs", "0"], ">= 1"),
    (OPT + ["--gpus", "0"], ">= 1"),
    (OPT + ["--board", "GARBAGE"], "not a SQLite database"),
    (OPT + ["--board", "DIR"], "is a directory"),
    (OPT + ["--board", "mysql://u@h/db"], "unknown scheme"),
    (OPT + ["--board", "sqlite:////no/such/dir/b.db"], "does not exist"),
    (OPT + ["--out", "FILE"], "existing file"),
    (["optimize", "--model", "tiny-dense", "--hw", "h200", "--traffic", "DIR"], "is a directory"),
    (["recompile", "--plan", "DIR", "--traffic", CONV, "--budget", "0"], "more than 0"),
    (["candidate", "check", "FILE", "--model", "tiny-dense", "--timeout", "-1"], "> 0"),
    (["candidate", "check", "FILE", "--model", "tiny-dense", "--timeout", "inf"], "finite"),
    (["candidate", "check", "DIR", "--model", "tiny-dense"], "is a directory"),
    (["ui", "--port", "70000"], "<= 65535"),
    (["ui", "--port", "-1"], ">= 0"),
    (["ui", "--board", "GARBAGE"], "not a SQLite database"),
    (["engine", "serve", "--model", "tiny-dense", "--port", "99999"], "<= 65535"),
]


@pytest.mark.parametrize("argv,needle", CASES, ids=[" ".join(a[:2] + a[-2:]) for a, _ in CASES])
def test_bad_input_is_one_line_and_exit_2(argv, needle, files, capsys):
    argv = [files.get(a, a) for a in argv]
    try:
        rc = main(argv)
    except SystemExit as e:                     # argparse's usage errors
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "internal error" not in err, err


def test_nan_thresholds_no_longer_hide_drift(capsys):
    """Before: ``--ks nan`` compared every statistic against NaN (always False) and said "no drift"."""
    with pytest.raises(SystemExit) as e:
        main(["traffic", "diff", CONV, CODE, "--ks", "nan", "--json"])
    assert e.value.code == 2
    capsys.readouterr()
    assert main(["traffic", "diff", CONV, CODE, "--json"]) == 1          # these two logs do drift
    assert json.loads(capsys.readouterr().out)["drift"] is True


def test_number_types():
    f = validate.positive_float
    assert f("1.5") == 1.5 and validate.count(0)("0") == 0 and validate.port("0") == 0
    for bad in ("nan", "inf", "-inf", "0", "-1", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            f(bad)
    with pytest.raises(argparse.ArgumentTypeError):
        validate.count(1)("1.5")


def test_finite_floats_is_the_safety_net():
    with pytest.raises(validate.UsageError, match="--rate"):
        validate.finite_floats(argparse.Namespace(rate=math.nan, n=3, name="x"))
    validate.finite_floats(argparse.Namespace(rate=1.0))


def test_board_urls(tmp_path):
    assert validate.board_url(str(tmp_path / "b.db")) == f"sqlite:///{tmp_path / 'b.db'}"
    assert validate.board_url("postgresql://u:p@localhost:5432/db").startswith("postgresql://")
    real = tmp_path / "real.db"
    from bulletin_board import Board
    Board(f"sqlite:///{real}").close()
    assert validate.board_url(str(real)).endswith("real.db")
    (tmp_path / "empty.db").write_bytes(b"")
    validate.board_url(str(tmp_path / "empty.db"))
    with pytest.raises(validate.UsageError, match="no host"):
        validate.board_url("postgresql:///db")
    with pytest.raises(Exception, match="cannot open the board at postgresql://u:\\*\\*\\*@127.0.0.1:9/db") as e:
        validate.open_board("postgresql://u:secret@127.0.0.1:9/db")      # a server that is down: one line
    assert e.value.user_error and "secret" not in str(e.value)
