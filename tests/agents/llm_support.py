"""Shared pieces of the agent-framework tests: a board on a temporary SQLite file and an in-process
judge (the op contract suite ``persistent_engine.ops.contract.check_op`` plus a perf_counter A/B
timing) returning a CandidateVerdict, for swarm tests whose candidates cannot crash.
The LLM agent tests use the real engine supervisor instead."""

from __future__ import annotations

import time
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


def inline_judge(source: str, timeout_s: float = 0.0):
    """``judge_source`` in this process (fast; for tests whose candidates cannot crash)."""
    out = judge_source(source)
    from persistent_engine.supervisor import CandidateVerdict
    return CandidateVerdict(out["correct"], out["reasons"], out["speedup"])


def make_board(tmp_path):
    from bulletin_board import Board
    return Board(f"sqlite:///{tmp_path / 'board.db'}")
