"""The supervisor and the judge's executors: start-up stages; a candidate that crashes (abort, segfault),
hangs (the judge's watchdog) or leaks a thread takes only its executor down: it is rejected for that reason,
the judge (same process) serves the next candidate on a fresh executor; a judge that died is restarted."""

import pathlib

import pytest

from persistent_engine import io_struct
from persistent_engine.supervisor import (STAGES, EngineStartError, Supervisor, describe_exit,
                                          startup_table)

HERE = pathlib.Path(__file__).parent / "candidates"


def src(name: str) -> str:
    return (HERE / f"{name}.py").read_text()


@pytest.fixture(scope="module")
def sup():
    lines = []
    s = Supervisor("tiny-dense", layers=[0, 1], device="cpu", start_timeout_s=300, log=lines.append)
    s.log_lines = lines
    s.start()
    yield s
    s.close()
    assert not s.alive()


def test_start_up_is_logged_stage_by_stage(sup):
    assert list(sup.startup)[:len(STAGES)] == list(STAGES)
    assert all(sup.startup[k] >= 0 for k in STAGES) and sup.startup["imports"] > 0
    assert sup.startup["total_to_ready"] >= sup.startup["weights"]
    assert any(line.startswith("[engine] weights") for line in sup.log_lines)
    table = startup_table(sup.startup)
    assert "graph_capture" in table and "spawn to ready" in table
    st = sup.status()
    assert st.ok and st.layers == [0, 1] and st.device == "cpu" and set(STAGES) <= set(st.startup)


HOSTILE = [
    ("abort_sneaky", "crash: executor died during verify (killed by SIGABRT)", 60),
    ("segfault", "crash: executor died during verify (killed by SIGSEGV)", 60),
    ("stderr_then_exits", "crash: executor died during verify (exit code 7); its stderr ended: candidate stderr "
                          "line 10 | ", 60),
    ("hang", "hang: no answer during verify within", 6),
    ("leaks_thread", "candidate left 1 thread(s) running: candidate-worker", 60),
    ("slows_baseline", "load: candidate changed the op registry: linear", 60),
]


@pytest.mark.parametrize("name, reason, timeout", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_only_the_executor_goes_and_the_judge_serves_the_next_candidate(sup, name, reason, timeout):
    pid = sup.proc.pid
    restarts = len(sup.restarts)
    used = sup.status().executors_used
    logged = len(sup.log_lines)
    v = sup.evaluate(src(name), timeout_s=timeout)
    assert not v.correct and not v.restarted
    assert any(reason in r for r in v.reasons), v.reasons
    death = {"abort_sneaky": "candidate executor died during verify: killed by SIGABRT",
             "segfault": "candidate executor died during verify: killed by SIGSEGV",
             "stderr_then_exits": "candidate executor died during verify: exit code 7",
             "hang": "candidate executor killed: no answer during verify"}.get(name)
    if death:                                   # the run's log names the executor's death and why (issue 41)
        assert any(line.startswith("[engine] " + death) for line in sup.log_lines[logged:]), sup.log_lines[logged:]
    assert len(v.reasons) == 1, v.reasons
    if name == "stderr_then_exits":             # the last 20 lines it wrote, in order, nothing before them
        assert v.reasons[0].endswith("candidate stderr line 29") and "line 9 |" not in v.reasons[0], v.reasons
    assert sup.alive() and sup.proc.pid == pid and len(sup.restarts) == restarts
    nxt = sup.evaluate(src("good_torch"), timeout_s=120)
    assert nxt.correct and not nxt.restarted, nxt.reasons
    assert sup.status().executors_used == used + 2          # a fresh executor for each candidate


def test_an_engine_that_died_between_calls_is_restarted_on_the_next(sup):
    sup._kill()
    assert not sup.alive()
    v = sup.evaluate(src("good_torch"), timeout_s=120)
    assert v.correct and v.restarted
    assert "engine had exited" in sup.restarts[-1]["reason"]


def test_bad_model_fails_to_start_with_one_clear_error():
    s = Supervisor("no-such-model", device="cpu", start_timeout_s=120)
    with pytest.raises(EngineStartError, match="unknown model"):
        s.start()
    s.close()


def test_describe_exit():
    assert describe_exit(-6) == "killed by SIGABRT" and describe_exit(-11) == "killed by SIGSEGV"
    assert describe_exit(1) == "exit code 1" and "device error" in describe_exit(3)


class _AliveProc:
    pid = 1

    def poll(self):
        return None


class _GuardsAtUnload:
    """A judge whose guards find, once the candidate is gone, that the shared weights changed (CUDA: the
    executors map them writable): the unload reply carries the finding."""

    def prepare(self, **kw):
        return None

    def load_candidate(self, source, name, timeout_s=None):
        return io_struct.LoadReply(ops=["fused_add_rms_norm"])

    def verify(self, seed, timeout_s=None):
        return io_struct.VerifyReply()

    def bench(self, samples, warmup, timeout_s=None):
        return io_struct.BenchReply(speedup=3.0)

    def unload(self, timeout_s=None):
        found = "unload: candidate changed the weights: model.final_norm"
        return io_struct.UnloadReply(restored=["candidate c", found], reasons=[found])


def test_a_guard_finding_at_unload_rejects_the_candidate():
    """Issue 38: what the judge's guards find after the candidate left is part of its verdict (it was
    dropped before: the verdict said correct at 3x)."""
    sup = Supervisor("tiny-dense", device="cpu", auto_restart=False)
    sup.proc, sup.client = _AliveProc(), _GuardsAtUnload()
    v = sup.evaluate("OVERRIDES = {}", timeout_s=30)
    assert not v.correct and v.reasons == ["unload: candidate changed the weights: model.final_norm"]


def test_engine_lines_are_forwarded_whole_once_and_a_line_longer_than_a_chunk_is_passed_over():
    lines: list[str] = []
    s = Supervisor("tiny-dense", layers=[0], device="cpu", log=lines.append)     # not started: its stderr file only
    try:
        path = pathlib.Path(s._stderr_path)
        path.write_bytes(b"tkcc-engine[7]: executor died (exit 9)\nother text\ntkcc-engine[7]: half a li")
        s._forward_engine_lines()
        assert lines == ["[engine] executor died (exit 9)"]
        with path.open("ab") as f:
            f.write(b"ne\n" + b"tkcc-engine[7]: " + b"x" * (64 << 10) + b"\ntkcc-engine[7]: after it\n")
        s._forward_engine_lines()                    # the completed line, then the long one's first chunk
        s._forward_engine_lines()
        s._forward_engine_lines()
        assert lines[1] == "[engine] half a line"
        assert lines[-1] == "[engine] after it" and len(lines) == 3, [x[:40] for x in lines]
    finally:
        s.close()
