"""``--budget`` bounds the whole run (issue 21): start-up, baseline, search, composition and writing, with
each phase's share in the progress line, plan.json and the report (a whole 2-minute run: ``make demo`` in
tests/compiler/test_ui_real_run.py); a run that cannot start within its budget says so and exits."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from compiler.search.budget import Budget, BudgetError
from compiler.search.progress import Progress

ROOT = Path(__file__).resolve().parents[2]
CONV = str(ROOT / "examples" / "traffic" / "azure2023_conv.csv")


def optimize(out: Path, budget: str, *extra: str, timeout: float = 300) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "compiler", "optimize", "--model", "tiny-dense", "--hw", "h200",
                        "--traffic", CONV, "--budget", budget, "--agents", "offline:2", "--out", str(out), *extra],
                       capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    return r, time.monotonic() - t0


def test_phase_ends_are_counted_back_from_the_bound():
    b = Budget(120.0, start=1000.0)
    assert b.end == 1120.0 and b.compose_end == 1102.0 and b.search_end == 1072.0
    assert Budget(10.0, start=0.0).write_reserve_s == 5.0 and Budget(3600.0, start=0).write_reserve_s == 30.0
    unbounded = Budget(None, start=0.0)
    assert unbounded.end == float("inf") and unbounded.startup_timeout(900.0) == 900.0
    with pytest.raises(BudgetError, match="too short to start"):
        Budget(8.0).startup_timeout(900.0)


def test_progress_reports_each_phases_share():
    p = Progress(time.monotonic() + 60, quiet=True, started=time.monotonic() - 3.0)
    p.phase("baseline")
    time.sleep(0.05)
    snap = p.snapshot()
    assert set(snap.phases) == {"starting", "baseline"} and snap.phases["starting"] >= 2.9
    assert "time: starting" in snap.line() and "% baseline" in snap.line()


def test_a_budget_too_short_to_start_is_one_line_exit_2(tmp_path):
    r, wall = optimize(tmp_path / "p", "8s", timeout=120)
    assert r.returncode == 2, r.stderr
    assert "too short to start" in r.stderr.strip().splitlines()[-1] and wall < 60


def test_engines_not_ready_within_the_budget_end_the_run(tmp_path):
    """14 s leave about 4 s for start-up (5 s each for composition and writing): the engines cannot be
    ready (on a fast machine), the estimate of their start-up exceeds what is left (compiler/search/startup_estimate.py),
    or the reading of the inputs already took those seconds (on a loaded one); either way one line says the run
    cannot start within its budget, and nothing is left behind."""
    r, wall = optimize(tmp_path / "p", "14s", timeout=120)
    assert r.returncode == 2, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert ("not ready within the run's budget" in last or "too short to start" in last
            or "to start the engines; they need at least" in last), last
    assert "Traceback" not in r.stderr
    assert wall < 14 + 30                      # start-up cut at its share; the rest is the interpreter and imports
    assert not (tmp_path / "p" / "v1").exists()
