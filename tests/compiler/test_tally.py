"""The run's one count (compiler/search/tally.py): accepted covers kernels and every accepted setting, kept is
the composition, dropped says why for each accepted one left out, and the progress view ends on it."""

import io
import time
from types import SimpleNamespace as NS

from compiler.search.progress import Progress
from compiler.plan.report import _counts_cell, _dropped_lines
from compiler.search.tally import SUPERSEDED, Tally, accepted_by_author, tally_of


def _acc(name, author, slow):
    return NS(name=name, author=author, slow=slow)


def _acceptor():
    kernels = [_acc("k-rms", "offline-0", 1.30), _acc("k-rms-2", "offline-1", 1.10), _acc("k-rot", "llm", 1.05)]
    configs = [_acc("config-a", "offline-0", 1.0), _acc("config-b", "offline-1", 1.0)]
    return NS(inner=NS(accepted=kernels), configs=configs)


def test_a_tally_counts_every_accepted_one_and_says_why_each_left_out_is_dropped():
    acceptor = _acceptor()
    parts = (acceptor.inner.accepted[0], acceptor.configs[1])          # what the composition kept
    comp = NS(parts=parts, slow=1.2345, dropped=(("k-rms-2", "overrides an op or knob of a faster accepted "
                                                  "candidate"),))
    t = tally_of({"tried": 12, "correct": 9, "fast_passed": 4, "accepted": 3}, acceptor, comp)
    assert (t.tried, t.correct, t.fast_passed, t.accepted, t.kept) == (12, 9, 4, 5, 2)
    assert dict(t.dropped) == {"k-rms-2": "overrides an op or knob of a faster accepted candidate",
                               "config-a": SUPERSEDED, "k-rot": "not in the composition"}
    assert t.kept + len(t.dropped) == t.accepted
    assert t.plan_speedup == 1.2345 and t.best_single == 1.30
    assert Tally.from_dict(t.to_dict()) == t
    line = t.line()
    assert line.startswith("tried 12, correct 9, fast-pass 4, accepted 5, kept 2, plan 1.234x; dropped 1: ")
    assert accepted_by_author(acceptor) == {"offline-0": 2, "offline-1": 2, "llm": 1}


def test_nothing_accepted_has_no_plan_speedup_and_an_interrupted_composition_no_star_row():
    empty = tally_of({"tried": 3, "correct": 1}, NS(accepted=[]), None)
    assert (empty.accepted, empty.kept, empty.dropped, empty.plan_speedup) == (0, 0, (), None)
    assert "plan n/a (nothing kept)" in empty.line()
    a = _acc("k", "x", 1.2)
    stopped = tally_of({}, NS(accepted=[a]), NS(parts=(a,), slow=float("nan"),
                                                dropped=(("*", "not re-measured: interrupted"),)))
    assert stopped.dropped == () and stopped.plan_speedup is None and stopped.kept == 1


def test_the_progress_view_and_the_report_end_on_the_tally():
    out = io.StringIO()
    p = Progress(time.monotonic() + 60, stream=out)
    p.count("tried", 2)
    p.accepted(1.1)                       # a setting accepted twice, say: the live counter ran ahead
    p.accepted(1.0)
    t = tally_of({"tried": 7, "correct": 5, "fast_passed": 2}, _acceptor(), None)
    p.settle(t)
    p.count("tried")                      # an evaluation cut by the search's end, counted after the tally
    p.accepted(2.0)
    snap = p.snapshot()
    assert (snap.tried, snap.accepted, snap.best_speedup) == (7, 5, 1.30)
    assert f"[tkcc] result: {t.line()}" in out.getvalue()
    d = t.to_dict()
    assert _counts_cell({"counts": d}, 0) == "tried 7, correct 5, fast-pass 2, accepted 5, kept 0, dropped 5"
    assert _dropped_lines(d["dropped"])[0] == "## Accepted, not kept" and len(_dropped_lines(d["dropped"])) == 10


def test_a_recompile_stays_under_its_first_versions_deployment(tmp_path, monkeypatch):
    """Issue 46: a recompile on drifted traffic was a second deployment; its run now names the parent
    version's deployment (``plan.run.deployment_hash``, else the parent's traffic hash)."""
    from compiler.search import loop
    from compiler.plan import artifact as plan_mod

    parents = {"v1": NS(run={}, traffic={"hash": "h-first"}),
               "v2": NS(run={"deployment_hash": "h-first"}, traffic={"hash": "h-drifted"})}

    def load(path):
        if path.name not in parents:
            raise plan_mod.PlanError(f"no plan at {path}")
        return parents[path.name], path

    monkeypatch.setattr(plan_mod, "load", load)
    assert loop.deployment_hash_of(tmp_path, None, "h-now") == "h-now"          # a root's first version
    assert loop.deployment_hash_of(tmp_path, 1, "h-drifted") == "h-first"
    assert loop.deployment_hash_of(tmp_path, 2, "h-again") == "h-first"
    assert loop.deployment_hash_of(tmp_path, 7, "h-now") == "h-now"             # an unreadable parent
