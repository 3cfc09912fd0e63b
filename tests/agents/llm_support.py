"""Shared pieces of the agent-framework tests: a board on a temporary SQLite file, a run context, and
an evaluator that judges a candidate in a fresh subprocess with the op contract suite
(``persistent_engine.ops.contract.check_op``) and a perf_counter A/B timing, returning a
CandidateVerdict-shaped object."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"


def judge_source(source: str) -> dict:
    """Load ``source`` as a fresh module, run the contract suite on every override (fp32) and time
    it against the reference (perf_counter_ns medians on the largest example shape)."""
    import types

    import torch

    from persistent_engine.ops import registry
    from persistent_engine.ops.contract import check_op

    mod = types.ModuleType("candidate")
    exec(compile(source, "candidate.py", "exec"), mod.__dict__)
    reasons, speedups = [], []
    for name, fn in mod.OVERRIDES.items():
        reasons += [f"{name}: {r}" for r in check_op(name, fn, dtypes=(torch.float32,))]
        op = registry.get(name)
        args = op.make_inputs(op.examples[-1], torch.float32, "cpu", 0)

        def median_ns(f, n=41):
            ts = []
            for _ in range(n):
                t0 = time.perf_counter_ns()
                f(*args)
                ts.append(time.perf_counter_ns() - t0)
            return sorted(ts)[n // 2]

        speedups.append(median_ns(op.reference) / max(median_ns(fn), 1))
    return {"correct": not reasons, "reasons": reasons,
            "speedup": min(speedups) if speedups and not reasons else None}


_JUDGE = ("import json, sys; sys.path.insert(0, {dir!r}); import llm_support; "
          "print(json.dumps(llm_support.judge_source(sys.stdin.read())))")


@dataclass(frozen=True)
class Verdict:
    """The fields of persistent_engine's CandidateVerdict."""

    correct: bool
    reasons: list
    speedup: float | None
    per_point: list = field(default_factory=list)
    timings: dict = field(default_factory=dict)
    restarted: bool = False


def contract_judge(source: str, timeout_s: float = 120.0) -> Verdict:
    """Judge ``source`` in a fresh Python process; a crash or a hang is a rejection, never an error."""
    t0 = time.perf_counter()
    try:
        code = _JUDGE.format(dir=str(Path(__file__).parent))
        proc = subprocess.run([sys.executable, "-c", code], input=source, capture_output=True,
                              text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return Verdict(False, [f"timed out after {timeout_s:.0f}s"], None, restarted=True)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return Verdict(False, [f"judge process failed: {tail}"], None, restarted=True)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return Verdict(out["correct"], out["reasons"], out["speedup"],
                   timings={"judge_s": time.perf_counter() - t0})


def inline_judge(source: str, timeout_s: float = 0.0) -> Verdict:
    """``judge_source`` in this process (fast; for tests whose candidates cannot crash)."""
    out = judge_source(source)
    return Verdict(out["correct"], out["reasons"], out["speedup"])


def make_board(tmp_path):
    from bulletin_board import Board
    return Board(f"sqlite:///{tmp_path / 'board.db'}")
