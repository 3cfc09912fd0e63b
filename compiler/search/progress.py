"""The live progress view of ``tkcc optimize``: candidates tried and accepted, best speedup,
engine restarts, time left. Thread-safe (agents report from their threads); a background thread
redraws one status line on a terminal (``\\r``) or prints a line every ``every_s`` otherwise, and
every state change can also be mirrored to the board's run row (``on_change``)."""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, TextIO


@dataclass(frozen=True)
class Snapshot:
    """One consistent view of the run's progress."""

    phase: str                 # "starting" | "baseline" | "searching" | "composing" | "writing" | "done"
    tried: int
    correct: int
    fast_passed: int           # beat the fast-tier noise (sent to the slow tier)
    accepted: int              # confirmed on the slow tier
    best_speedup: float | None # best slow-tier speedup of an accepted candidate
    restarts: int
    elapsed_s: float
    time_left_s: float
    phases: dict = field(default_factory=dict)   # phase -> seconds spent in it so far (the current one too)

    def to_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        best = "-" if self.best_speedup is None else f"{self.best_speedup:.3f}x"
        return (f"[tkcc] {self.phase:<9} tried {self.tried:>3}  correct {self.correct:>3}  "
                f"fast-pass {self.fast_passed:>2}  accepted {self.accepted:>2}  best {best:>7}  "
                f"restarts {self.restarts}  left {max(self.time_left_s, 0):5.0f}s" + self.shares())

    def shares(self) -> str:
        """``  time: starting 12% baseline 20% searching 68%``: each phase's share of the elapsed time."""
        total = sum(self.phases.values())
        if total <= 0:
            return ""
        return "  time: " + " ".join(f"{name} {100 * s / total:.0f}%" for name, s in self.phases.items())


class Progress:
    """Counters of one optimize run. ``deadline`` is a ``time.monotonic()`` value."""

    def __init__(self, deadline: float, *, stream: TextIO | None = None, every_s: float = 5.0,
                 on_change: Callable[[Snapshot], None] | None = None, quiet: bool = False,
                 started: float | None = None):
        self._lock = threading.Lock()
        self._start = time.monotonic() if started is None else started
        self._phase_since = self._start
        self._phase_s: dict[str, float] = {}
        self.deadline = deadline
        self._phase = "starting"
        self._counts = {"tried": 0, "correct": 0, "fast_passed": 0, "accepted": 0}
        self._settled = False                # set by settle(): the counts are the run's tally from then on
        self._best: float | None = None
        self._restarts_fn: Callable[[], int] = lambda: 0
        self._stream = stream if stream is not None else sys.stderr
        self._every_s = every_s
        self.on_change = on_change
        self._quiet = quiet
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._tty = bool(getattr(self._stream, "isatty", lambda: False)())

    # ---------------------------------------------------------------- updates
    def restarts_from(self, fn: Callable[[], int]) -> None:
        """Where engine restarts are read from (the fleet's counter)."""
        self._restarts_fn = fn

    def phase(self, name: str) -> None:
        with self._lock:
            now = time.monotonic()
            self._phase_s[self._phase] = self._phase_s.get(self._phase, 0.0) + now - self._phase_since
            self._phase, self._phase_since = name, now
        self._changed()
        self.event(f"phase: {name}")

    def count(self, what: str, n: int = 1) -> None:
        with self._lock:
            if self._settled:                # an evaluation the search's end cut: not part of the run's tally
                return
            self._counts[what] += n
        self._changed()

    def accepted(self, speedup: float) -> None:
        with self._lock:
            if self._settled:
                return
            self._counts["accepted"] += 1
            self._best = speedup if self._best is None else max(self._best, speedup)
        self._changed()

    def settle(self, tally: Any) -> None:
        """The counters set to the run's tally (``compiler.search.tally.Tally``: also settings accepted or recalled
        outside the judge's counting) and frozen there, and its line printed: the view ends on the one count."""
        with self._lock:
            self._settled = True
            self._counts.update(tried=tally.tried, correct=tally.correct, fast_passed=tally.fast_passed,
                                accepted=tally.accepted)
            self._best = tally.best_single
        self._changed()
        self.event(f"result: {tally.line()}")

    def event(self, message: str) -> None:
        """A one-off line (accepted X, engine restarted, ...) above the status line."""
        if self._quiet:
            return
        with self._lock:
            clear = "\r\x1b[2K" if self._tty else ""
            print(f"{clear}[tkcc] {message}", file=self._stream, flush=True)

    def snapshot(self) -> Snapshot:
        try:
            restarts = int(self._restarts_fn())
        except Exception:  # noqa: BLE001 - a fleet mid-teardown must not break the view
            restarts = 0
        now = time.monotonic()
        with self._lock:
            return Snapshot(phase=self._phase, best_speedup=self._best, restarts=restarts,
                            elapsed_s=round(now - self._start, 1),
                            time_left_s=round(self.deadline - now, 1), phases=self._phases(now), **self._counts)

    def _phases(self, now: float) -> dict[str, float]:
        out = dict(self._phase_s)
        if self._phase != "done":
            out[self._phase] = out.get(self._phase, 0.0) + now - self._phase_since
        return {k: round(v, 1) for k, v in out.items()}

    def _changed(self) -> None:
        if self.on_change is not None:
            try:
                self.on_change(self.snapshot())
            except Exception:  # noqa: BLE001 - the board mirror is best effort
                pass

    # ---------------------------------------------------------------- drawing
    def start(self) -> "Progress":
        if not self._quiet and self._thread is None:
            self._thread = threading.Thread(target=self._draw, name="tkcc-progress", daemon=True)
            self._thread.start()
        return self

    def _draw(self) -> None:
        period = 0.5 if self._tty else self._every_s
        while not self._stop.wait(period):
            line = self.snapshot().line()
            with self._lock:
                if self._tty:
                    print(f"\r\x1b[2K{line}", end="", file=self._stream, flush=True)
                else:
                    print(line, file=self._stream, flush=True)

    def close(self) -> Snapshot:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        snap = self.snapshot()
        if not self._quiet:
            with self._lock:
                end = "\r\x1b[2K" if self._tty else ""
                print(f"{end}{snap.line()}", file=self._stream, flush=True)
        return snap
