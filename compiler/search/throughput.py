"""Experiment throughput: where each engine's time goes during the search.

:class:`DeviceClock` wraps a fleet (``LocalFleet``: its engines one by one; any other fleet, e.g.
Ray's: one "engine" per tier) and books every evaluation of the search window:

    queue_wait_s   the caller waited for a free engine of the tier (fleet queue + the device's lock)
    executor_wait_s  waiting for a warm sandboxed executor from the judge's pool (``timings.pool_wait_s``)
    compile_s      the engine loading the candidate: the executor importing it (Triton compiles, module
                   loading) (``timings.load_s``)
    judging_s      verification and timing on the device (``timings.verify_s + bench_s``): busy
    other_s        the rest of an evaluation (unload, RPC, a restart after a crash)
    compiled_ahead evaluations whose candidate an executor had loaded and compiled while it waited
                   (``timings.compiled_ahead``; persistent_engine/judge/executors.py)
    idle_s         the window's wall time with no evaluation on the engine

Per engine ``executor_wait_s + compile_s + judging_s + other_s + idle_s`` is the window's wall time
(``wall_s``); ``queue_wait_s`` is the callers' time, not the engine's. An evaluation still running when
the window closes (the search's last fast-tier candidate, a slow-tier confirmation) is booked up to the
close, its phases in their order (pool wait, load, judging, the rest), and counted in ``in_flight_at_close``
instead of ``calls`` (before, its whole time in the window read as idle).
``summary()`` adds ``candidates_per_hour`` (fast-tier evaluations of the window per hour of it and
per device) and ``device_busy_fraction`` (judging time / (wall x devices)).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from compiler.fleet.local import unjudged

if TYPE_CHECKING:
    from bulletin_board import BoardAPI
    from compiler.fleet.local import Fleet

__all__ = ["DeviceClock", "EngineTime", "run_fields"]


@dataclass
class EngineTime:
    tier: str
    device: str
    calls: int = 0
    in_flight_at_close: int = 0
    queue_wait_s: float = 0.0
    executor_wait_s: float = 0.0
    compile_s: float = 0.0
    judging_s: float = 0.0
    other_s: float = 0.0
    compiled_ahead: int = 0
    busy_spans: list = field(default_factory=list)      # (start, end) monotonic of each evaluation

    def book(self, t0: float, t1: float, waited: float, timings: dict, close: float = float("inf")) -> None:
        """One evaluation on the engine from ``t0`` to ``t1``; past ``close`` (the window's end) nothing of
        it is booked, and the phases are clipped in the order they ran."""
        ended = t1 <= close
        t1 = min(t1, close)
        span = max(t1 - t0, 0.0)
        pool = min(float(timings.get("pool_wait_s") or 0.0), span)
        load = min(float(timings.get("load_s") or 0.0), span - pool)
        judging = min(float(timings.get("verify_s") or 0.0) + float(timings.get("bench_s") or 0.0),
                      span - pool - load)
        self.calls += int(ended)
        self.compiled_ahead += int(bool(timings.get("compiled_ahead")))
        self.in_flight_at_close += int(not ended)
        self.queue_wait_s += max(waited, 0.0)
        self.executor_wait_s += pool
        self.compile_s += load
        self.judging_s += judging
        self.other_s += span - pool - load - judging
        self.busy_spans.append((t0, t1))


class _TimedLock:
    """A device's measure lock that notes (thread-locally) when the caller got it."""

    def __init__(self, lock: Any, local: threading.local):
        self.lock, self.local = lock, local

    def __enter__(self) -> "_TimedLock":
        self.lock.acquire()
        self.local.acquired = time.monotonic()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.lock.release()


class DeviceClock:
    """Installs itself on ``fleet`` (``install``); books evaluations made between ``open`` and ``close``."""

    def __init__(self, fleet: Fleet):
        self.fleet = fleet
        self.engines: dict[str, EngineTime] = {}
        self.lock = threading.Lock()
        self.local = threading.local()
        self.t_open: float | None = None
        self.t_close: float | None = None

    def install(self) -> "DeviceClock":
        inner_fleet = self.fleet.evaluate

        def fleet_evaluate(tier: str, source: str) -> Any:
            self.local.called = time.monotonic()
            self.local.booked = False
            t0 = self.local.called
            verdict = inner_fleet(tier, source)
            if not self.local.booked:               # a fleet without local engines (Ray): book it here
                self._book(f"{tier}", tier, "", t0, time.monotonic(), 0.0, verdict)
            return verdict

        self.fleet.evaluate = fleet_evaluate
        locks: dict[int, _TimedLock] = {}
        for i, engine in enumerate(getattr(self.fleet, "engines", ()) or ()):
            lock = engine.measure_lock              # engines of one device share it: one timed wrapper
            engine.measure_lock = locks.setdefault(id(lock), _TimedLock(lock, self.local))
            self._wrap_engine(f"{engine.tier}-{i}", engine)
        return self

    def _wrap_engine(self, key: str, engine: Any) -> None:
        inner = engine.evaluate

        def engine_evaluate(source: str, timeout_s: float, deadline: float = float("inf"), **kw: Any) -> Any:
            called = getattr(self.local, "called", time.monotonic())
            self.local.acquired = None
            verdict = inner(source, timeout_s, deadline, **kw)
            end = time.monotonic()
            start = self.local.acquired or end      # when it got the device's lock (queue wait before it)
            self._book(key, engine.tier, str(getattr(engine.placement, "device", "")), start, end,
                       start - called, verdict)
            self.local.booked = True
            return verdict

        engine.evaluate = engine_evaluate

    def _book(self, key: str, tier: str, device: str, t0: float, t1: float, waited: float, verdict: Any) -> None:
        if self.t_open is None or t0 < self.t_open or (self.t_close is not None and t0 >= self.t_close):
            return
        timings = getattr(verdict, "timings", None) or {}
        if not timings and unjudged(verdict):      # refused at the run's end: it never reached the device
            return
        with self.lock:
            close = self.t_close if self.t_close is not None else float("inf")
            self.engines.setdefault(key, EngineTime(tier, device)).book(t0, t1, waited, timings, close)

    def open(self) -> None:
        self.t_open = time.monotonic()

    def close(self) -> None:
        if self.t_open is not None and self.t_close is None:
            self.t_close = time.monotonic()

    def summary(self) -> dict:
        """Per engine figures of the window (module doc) and the two headline figures; empty when the
        window never opened."""
        if self.t_open is None:
            return {}
        end = self.t_close if self.t_close is not None else time.monotonic()
        wall = max(end - self.t_open, 1e-9)
        rows = {}
        with self.lock:
            for key, e in sorted(self.engines.items()):
                busy = sum(min(t1, end) - t0 for t0, t1 in e.busy_spans if t0 < end)
                rows[key] = {"tier": e.tier, "device": e.device, "calls": e.calls,
                             "in_flight_at_close": e.in_flight_at_close,
                             "queue_wait_s": round(e.queue_wait_s, 3),
                             "executor_wait_s": round(e.executor_wait_s, 3), "compile_s": round(e.compile_s, 3),
                             "judging_s": round(e.judging_s, 3), "other_s": round(e.other_s, 3),
                             "compiled_ahead": e.compiled_ahead,
                             "idle_s": round(max(wall - busy, 0.0), 3), "wall_s": round(wall, 3)}
        devices = max(len({r["device"] for r in rows.values()}), 1)
        fast_calls = sum(r["calls"] for r in rows.values() if r["tier"] == "fast")
        judging = sum(r["judging_s"] for r in rows.values())
        return {"window_s": round(wall, 3), "devices": devices, "engines": rows,
                "candidates_per_hour": round(3600.0 * fast_calls / wall / devices, 1),
                "device_busy_fraction": round(min(judging / (wall * devices), 1.0), 4)}


def run_fields(board: BoardAPI, run_id: Any, clock: DeviceClock | None, remembered: int = 0,
               configs: list[dict] | None = None) -> dict:
    """The plan's ``run`` entries of the search's throughput (also into the run's config on the board,
    where the UI reads it): ``candidates_per_hour``, ``device_busy_fraction`` (None when the search
    never ran), ``throughput`` (the per-engine breakdown) and ``remembered`` (candidates not judged
    again: their verdicts were known from earlier runs); ``configs`` (the plan's accepted settings with
    their projected effect) go to the board only, as ``config_optimizations``."""
    summary = clock.summary() if clock is not None else {}
    fields = {"candidates_per_hour": summary.get("candidates_per_hour"),
              "device_busy_fraction": summary.get("device_busy_fraction"),
              "throughput": summary, "remembered": int(remembered)}
    try:
        run = board.get_run(run_id)
        if run is not None:
            board.update_run(run_id, config={**(run.config or {}), **fields,
                                             "config_optimizations": list(configs or [])})
    except Exception:  # noqa: BLE001 - board bookkeeping never stops a run
        pass
    return fields

