"""The whole-run time budget of ``tkcc optimize --budget`` (docs/errors.md "Budgets").

One wall-clock bound covers start-up, baseline, search, composition and writing. The phases' ends
are counted back from the bound::

    start ............ search_end | compose_end | end
    start-up, baseline, search   | composition | writing (per-op profile, report, plan)

``compose`` and ``write`` reserves are 25% and 15% of the budget (at least 5 s; at most 2 min and 30 s):
re-measuring one composed set takes a fast-tier and a slow-tier evaluation (each a fresh executor, verify and
the A/B: ~10 s on a busy 2-core CPU), and the search's last evaluation may still be in flight at its end;
writing took 6-7 s of the H200's 5- and 6-minute runs (2026-12-04), so its 30 s cap leaves the rest to
the composition.
``search_end`` is where the search would end if the composition needed its whole reserve; the search
runs on past it until only what the judge still needs is left (``Judge.closing_s``: the evaluation in
flight, the confirmations owed, the composed set's measurement), so a run with nothing accepted searches
until one fast-tier evaluation before ``compose_end``. The fleet's start-up may use everything up to
``search_end``: engines not ready by then mean the run cannot start within its budget (``BudgetError``,
one line, exit 2). An evaluation still in flight at ``compose_end`` is cut there by the fleet.
``wall_s=None`` leaves a run unbounded (only the search has a length), what the library API does when
called without one.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

__all__ = ["Budget", "BudgetError"]


class BudgetError(RuntimeError):
    """The run cannot do its work within its budget (the message says which phase). Exit 2."""

    user_error = True


BASELINE_SHARE = 0.25                    # of the time left before the search's end, for the A/A noise rounds


def _clamp(x: float, low: float, high: float) -> float:
    return max(low, min(high, x))


@dataclass(frozen=True)
class Budget:
    wall_s: float | None                     # None: unbounded
    start: float = field(default_factory=time.monotonic)

    @property
    def end(self) -> float:
        return math.inf if self.wall_s is None else self.start + self.wall_s

    @property
    def write_reserve_s(self) -> float:
        return 0.0 if self.wall_s is None else _clamp(0.15 * self.wall_s, 5.0, 30.0)

    @property
    def compose_reserve_s(self) -> float:
        return 0.0 if self.wall_s is None else _clamp(0.25 * self.wall_s, 5.0, 120.0)

    @property
    def compose_end(self) -> float:
        return self.end - self.write_reserve_s

    @property
    def search_end(self) -> float:
        return self.compose_end - self.compose_reserve_s

    def left(self, until: float | None = None) -> float:
        """Seconds from now to ``until`` (default: the end), never negative; inf when unbounded."""
        return max(0.0, (self.end if until is None else until) - time.monotonic())

    def startup_timeout(self, default_s: float) -> float:
        """How long the engines may take to become ready: ``default_s``, and no later than the
        search's end. Raises BudgetError when nothing is left for start-up at all."""
        left = self.left(self.search_end)
        if left <= 0:
            raise BudgetError(f"--budget {self.wall_s:g} s is too short to start: composing and writing the plan "
                              f"alone are given {self.compose_reserve_s + self.write_reserve_s:.0f} s of it; "
                              "give a larger --budget")
        return min(default_s, left)

    def baseline_end(self, now: float | None = None) -> float:
        """The baseline's A/A noise runs start no round (one run of each tier) past this: 25% of what is
        left before the search's end (the rest is the search's). On the H200 (GLM-5.2, --budget 6m) 40%
        gave the baseline 80 s against the search's 85 s."""
        now = time.monotonic() if now is None else now
        return now + BASELINE_SHARE * max(0.0, self.search_end - now) if self.wall_s is not None else math.inf

    def not_started(self, timeout_s: float, error: BaseException) -> BudgetError:
        return BudgetError(f"the engines were not ready within the run's budget ({self.wall_s:g} s; start-up "
                           f"was given {timeout_s:.0f} s of it): give a larger --budget ({error})")
