"""compiler/search/throughput.py: the search window's per-engine time adds up to its wall time.

The fleet here is ``compiler.fleet.local.LocalFleet`` with its real ``TierEngine`` objects (queue, device lock,
retry); only the supervisor behind each engine is a stand-in that sleeps for the phases a verdict
reports, because what is tested is the booking, not the judging (the optimize tests judge for real)."""

from __future__ import annotations

import queue
import threading
import time

import pytest

from compiler.fleet.local import FleetConfig, LocalFleet, Placement, TierEngine
from compiler.search.throughput import DeviceClock
from persistent_engine.supervisor import CandidateVerdict


class SleepingSupervisor:
    """Takes ``load_s`` + ``verify_s`` + ``bench_s`` (+ 5 ms of unload) and says so in the verdict."""

    restarts: list = []
    auto_restart = True

    def __init__(self, load_s: float, verify_s: float, bench_s: float, ahead: bool = False):
        self.t = {"pool_wait_s": 0.01, "load_s": load_s, "verify_s": verify_s, "bench_s": bench_s}
        self.ahead = ahead

    def evaluate(self, source: str, timeout_s: float = 300.0, **_):
        time.sleep(sum(self.t.values()) + 0.005)
        return CandidateVerdict(correct=True, reasons=[], speedup=1.0,
                                timings={**self.t, "compiled_ahead": float(self.ahead)})


def _fleet() -> LocalFleet:
    fleet = LocalFleet(FleetConfig(model="tiny-dense", points=(), fast_layers=(0,), slow_layers=(0, 1)))
    lock = threading.Lock()                               # one device: the tiers share its lock
    fleet.engines = [TierEngine(Placement("fast", "cpu", (0,)), SleepingSupervisor(0.02, 0.03, 0.05, ahead=True),
                                lock),
                     TierEngine(Placement("slow", "cpu", (0, 1)), SleepingSupervisor(0.01, 0.02, 0.04), lock)]
    fleet._free = {"fast": queue.Queue(), "slow": queue.Queue()}
    for e in fleet.engines:
        fleet._free[e.tier].put(e)
    return fleet


def test_busy_compile_idle_and_queue_wait_add_up_to_the_window():
    fleet = _fleet()
    clock = DeviceClock(fleet).install()
    fleet.evaluate("fast", "before the window")           # not booked
    clock.open()
    threads = [threading.Thread(target=fleet.evaluate, args=("fast", f"c{i}")) for i in range(4)]
    threads += [threading.Thread(target=fleet.evaluate, args=("slow", "s"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    time.sleep(0.1)                                       # idle at the end of the window
    clock.close()
    s = clock.summary()
    fast, slow = s["engines"]["fast-0"], s["engines"]["slow-1"]
    assert (fast["calls"], slow["calls"]) == (4, 1)
    assert (fast["compiled_ahead"], slow["compiled_ahead"]) == (4, 0)
    assert fast["compile_s"] == pytest.approx(4 * 0.02, abs=1e-6)
    assert fast["executor_wait_s"] == pytest.approx(4 * 0.01, abs=1e-6)
    assert fast["judging_s"] == pytest.approx(4 * 0.08, abs=1e-6)
    for e in (fast, slow):
        total = e["executor_wait_s"] + e["compile_s"] + e["judging_s"] + e["other_s"] + e["idle_s"]
        assert total == pytest.approx(e["wall_s"], abs=0.01)
        assert e["idle_s"] >= 0.09
    # five evaluations on one device lock: all but the first waited; together at least 4 x 0.1 s
    waited = fast["queue_wait_s"] + slow["queue_wait_s"]
    assert waited >= 0.3
    assert s["devices"] == 1
    assert s["device_busy_fraction"] == pytest.approx((fast["judging_s"] + slow["judging_s"]) / s["window_s"], abs=1e-3)
    assert s["candidates_per_hour"] == pytest.approx(3600 * 4 / s["window_s"], rel=1e-3)


def test_a_clock_that_never_opened_reports_nothing():
    clock = DeviceClock(_fleet()).install()
    assert clock.summary() == {}


def test_an_evaluation_in_flight_at_the_close_is_busy_up_to_it_and_not_a_call():
    fleet = _fleet()
    fleet.engines[0].supervisor = SleepingSupervisor(0.02, 0.1, 0.2)     # 0.33 s in all
    clock = DeviceClock(fleet).install()
    clock.open()
    fleet.evaluate("fast", "c0")
    t = threading.Thread(target=fleet.evaluate, args=("fast", "in flight"))
    t.start()
    time.sleep(0.2)                                       # pool 0.01 + load 0.02 + 0.17 s of judging
    clock.close()
    t.join()
    fleet.evaluate("fast", "after the close")             # not booked
    s = clock.summary()
    fast = s["engines"]["fast-0"]
    assert (fast["calls"], fast["in_flight_at_close"]) == (1, 1)
    assert fast["compile_s"] == pytest.approx(2 * 0.02, abs=1e-6)
    assert 0.3 + 0.13 <= fast["judging_s"] <= 0.3 + 0.2                # c0's 0.3 s + the clipped one's
    assert fast["idle_s"] < 0.05                         # before, the in-flight 0.2 s read as idle
    total = fast["executor_wait_s"] + fast["compile_s"] + fast["judging_s"] + fast["other_s"] + fast["idle_s"]
    assert total == pytest.approx(fast["wall_s"], abs=0.01)
    assert s["candidates_per_hour"] == pytest.approx(3600 * 1 / s["window_s"], rel=1e-3)


class HangingSupervisor(SleepingSupervisor):
    """Answers nothing within the timeout it is given: a hang, as ``Supervisor.evaluate`` reports one."""

    def evaluate(self, source: str, timeout_s: float = 300.0, **_):
        time.sleep(min(timeout_s, 0.05))
        return CandidateVerdict(correct=False, reasons=[f"hang: no answer during verify within the {timeout_s:.1f} s "
                                                        "timeout (watchdog killed the executor)"], speedup=None,
                                timings={"load_s": 0.01, "verify_s": min(timeout_s, 0.05)})


def test_the_runs_end_refused_evaluations_are_no_calls_and_a_cut_hang_is_no_verdict():
    fleet = _fleet()
    clock = DeviceClock(fleet).install()
    clock.open()
    fleet.deadline = time.monotonic() - 1                 # spent: refused before the device
    refused = fleet.evaluate("fast", "late")
    assert refused.reasons == ["not evaluated: the run's budget is spent"]
    fleet.engines[0].supervisor = HangingSupervisor(0, 0, 0)
    fleet.deadline = time.monotonic() + 0.05              # the timeout (cfg.timeout_s) cut to what is left
    cut = fleet.evaluate("fast", "cut")
    assert cut.reasons[0].startswith("not evaluated: the run's budget is spent (its evaluation was cut")
    fleet.deadline = float("inf")
    hang = fleet.evaluate("fast", "hangs")                # a hang under its full timeout is the candidate's
    assert hang.reasons[0].startswith("hang: ")
    clock.close()
    assert clock.summary()["engines"]["fast-0"]["calls"] == 2      # the cut one ran on the device; the refusal did not
