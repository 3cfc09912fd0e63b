"""compiler.fleet.isolated: candidate measurements run in a child process, with failures as one-line errors."""

import os
import time

import pytest

from compiler.fleet.isolated import IsolatedError, run_isolated
from persistent_engine.io_struct import WorkloadPoint


def _where(tag: str, *, scale: int = 1) -> tuple[int, str, int]:
    os.environ["TKCC_ISOLATED_PROBE"] = tag          # a side effect that must stay in the child
    return os.getpid(), tag, 21 * scale


def _raises() -> None:
    raise ValueError("bad kernel")


def _dies() -> None:
    os._exit(3)


def _sleeps() -> None:
    time.sleep(60)


def test_the_call_runs_in_another_process_and_returns_its_result():
    pid, tag, value = run_isolated(_where, "x", scale=2)
    assert pid != os.getpid() and (tag, value) == ("x", 42)
    assert "TKCC_ISOLATED_PROBE" not in os.environ


def test_failures_are_one_line_errors():
    with pytest.raises(IsolatedError, match=r"_raises: ValueError: bad kernel"):
        run_isolated(_raises)
    with pytest.raises(IsolatedError, match=r"_dies: its process died \(exit code 3\)"):
        run_isolated(_dies)
    t0 = time.monotonic()
    with pytest.raises(IsolatedError, match=r"_sleeps did not finish within 3 s"):
        run_isolated(_sleeps, timeout_s=3)
    assert time.monotonic() - t0 < 30


def test_the_loop_measures_the_composed_plan_in_a_child(monkeypatch):
    """The optimize loop's per-op profile of the composed plan goes through run_isolated (never the
    orchestrator): the composition's source is executed only in the child."""
    from compiler.plan import writer as loop
    from compiler.search.acceptance import Composition
    from persistent_engine.models.spec import ModelSpec

    seen = []
    real = loop.run_isolated
    monkeypatch.setattr(loop, "run_isolated", lambda fn, *a, **k: seen.append(fn.__name__) or real(fn, *a, **k))
    src = ("import torch\n"
           "import os\n"
           "os.environ['TKCC_ISOLATED_PROBE'] = 'candidate'\n"
           "def lm_head(x, weight):\n"
           "    return torch.matmul(x, weight.t())\n"
           "OVERRIDES = {'lm_head': lm_head}\n")
    comp = Composition((object(),), src, 1.0, 1.0, (), ())
    points = [WorkloadPoint(phase="decode", batch=2, context=8, chunk=1, weight=1.0)]
    after = loop.op_ms_after(ModelSpec.from_name("tiny-dense"), [0], points, comp, {"kind": "cpu"})
    assert seen == ["op_times_with"]
    assert after["after"]["lm_head"] > 0 and after["before"]["lm_head"] > 0
    assert "TKCC_ISOLATED_PROBE" not in os.environ
