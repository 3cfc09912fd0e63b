"""compiler/fleet/local.py: an engine is told which sources wait for its tier behind the one it judges (the
judge compiles them ahead, tests/persistent_engine/judge/test_ahead.py).

The fleet is ``LocalFleet`` with its real ``TierEngine`` objects (queue, device lock); only the supervisor is a
stand-in that records what it was told, since what is tested is what reaches it."""

from __future__ import annotations

import queue
import threading
import time

from compiler.fleet.local import FleetConfig, LocalFleet, Placement, TierEngine
from compiler.search.throughput import DeviceClock
from persistent_engine.supervisor import CandidateVerdict


class RecordingSupervisor:
    restarts: list = []
    auto_restart = True

    def __init__(self, lock: threading.Lock | None = None):
        self.seen: list[tuple[str, list[str]]] = []
        self.prepared: list[tuple[list[str], bool]] = []   # (sources, whether the device's lock was held)
        self.lock = lock

    def prepare(self, sources: list[str]) -> None:
        self.prepared.append((list(sources), self.lock is not None and self.lock.locked()))

    def evaluate(self, source: str, timeout_s: float = 300.0, queued=()):
        self.seen.append((source, list(queued)))
        time.sleep(0.1)
        return CandidateVerdict(correct=True, reasons=[], speedup=1.0, timings={})


def _fleet() -> tuple[LocalFleet, RecordingSupervisor, RecordingSupervisor]:
    fleet = LocalFleet(FleetConfig(model="tiny-dense", points=(), fast_layers=(0,), slow_layers=(0, 1)))
    lock = threading.Lock()                               # one device: the tiers share its lock
    fast, slow = RecordingSupervisor(lock), RecordingSupervisor(lock)
    fleet.engines = [TierEngine(Placement("fast", "cpu", (0,)), fast, lock),
                     TierEngine(Placement("slow", "cpu", (0, 1)), slow, lock)]
    fleet._free = {"fast": queue.Queue(), "slow": queue.Queue()}
    for e in fleet.engines:
        fleet._free[e.tier].put(e)
    return fleet, fast, slow


def _together(fleet: LocalFleet, calls: list[tuple[str, str]]) -> None:
    """The calls started one after another (10 ms apart: arrival order is known), then all joined."""
    threads = [threading.Thread(target=fleet.evaluate, args=c) for c in calls]
    for t in threads:
        t.start()
        time.sleep(0.01)
    for t in threads:
        t.join()


def test_an_engine_hears_of_the_sources_queued_for_its_tier_only_first_come_first():
    fleet, fast, slow = _fleet()
    DeviceClock(fleet).install()                          # the optimize loop wraps the engines: still told
    _together(fleet, [("fast", "a"), ("fast", "b"), ("fast", "c"), ("fast", "d"), ("slow", "s")])
    assert [s for s, _ in fast.seen] == ["a", "b", "c", "d"]
    told = dict(fast.seen)
    assert told["a"] == []                                # alone when it took the engine
    assert told["b"] == ["c", "d"]                        # c and d arrived while a held the engine
    assert told["c"] == ["d"] and told["d"] == []
    assert slow.seen == [("s", [])]                       # the fast tier's queue is not the slow engine's
    assert fleet.queued("fast") == [] and fleet.queued("slow") == []


def test_a_source_leaves_the_queue_when_its_engine_takes_it_even_if_its_evaluation_fails():
    fleet, fast, _ = _fleet()

    def broken(source, timeout_s=300.0, queued=()):
        fast.seen.append((source, list(queued)))
        raise RuntimeError("engine gone")

    fast.evaluate = broken
    verdict = fleet.evaluate("fast", "x")
    assert not verdict.correct and "engine gone" in verdict.reasons[0]
    assert fleet.queued("fast") == [] and fast.seen == [("x", [])]


def test_the_engine_hears_of_its_next_source_and_the_queue_before_waiting_for_the_device():
    fleet, fast, slow = _fleet()
    _together(fleet, [("slow", "s"), ("fast", "a"), ("fast", "b")])
    # "a" arrived while the slow engine held the device: its engine was told before the lock was free
    prepared = dict((tuple(srcs)[0], held) for srcs, held in fast.prepared)
    assert [srcs for srcs, _ in fast.prepared] == [["a"], ["b"]]
    assert prepared["a"] is True                          # the lock was the slow engine's then
    assert slow.prepared == [(["s"], False)]
