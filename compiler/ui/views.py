"""Small view helpers shared by the UI's routes and templates: paging, query-string links, and the
Jinja2 filters that format times, speedups and workload points.

Nothing here touches the database; everything is a pure function of its arguments.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from typing import Any, Mapping
from urllib.parse import urlencode

from persistent_engine import point_label

PER_PAGE = 50
MAX_PER_PAGE = 200
MAX_PAGE = 10 ** 6                  # page * MAX_PER_PAGE stays far inside a 64-bit offset


@dataclass(frozen=True)
class Pager:
    """1-based page ``page`` of ``per_page`` rows out of ``total``; ``link(page)`` keeps the
    other query parameters of the current URL."""

    page: int
    per_page: int
    total: int
    path: str
    params: tuple[tuple[str, str], ...]

    @property
    def offset(self) -> int:
        return (self.page - 1) * self.per_page

    @property
    def pages(self) -> int:
        return max(1, math.ceil(self.total / self.per_page))

    @property
    def has_prev(self) -> bool:
        return self.page > 1

    @property
    def has_next(self) -> bool:
        return self.page < self.pages

    def link(self, page: int) -> str:
        return url(self.path, dict(self.params), page=page if page > 1 else None)


def pager(path: str, params: Mapping[str, Any], page: int, per_page: int, total: int = 0) -> Pager:
    """A Pager with ``page`` and ``per_page`` clamped to sane values (page stays >= 1)."""
    per_page = min(max(int(per_page), 1), MAX_PER_PAGE)
    kept = tuple((k, str(v)) for k, v in params.items() if v not in (None, "") and k != "page")
    return Pager(page=max(int(page), 1), per_page=per_page, total=total, path=path, params=kept)


def url(path: str, params: Mapping[str, Any], **changes: Any) -> str:
    """``path?query`` from ``params`` with ``changes`` applied (a None value drops the key)."""
    merged = {k: v for k, v in {**dict(params), **changes}.items() if v not in (None, "")}
    return path + ("?" + urlencode(merged) if merged else "")


def fmt_time(t: float | None) -> str:
    """Epoch seconds as ``YYYY-MM-DD HH:MM:SS`` (UTC)."""
    if t is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(t)))


def fmt_speedup(s: Any) -> str:
    if not isinstance(s, (int, float)) or not math.isfinite(s):
        return "-"
    return f"{s:.3f}x"


def fmt_ms(v: Any) -> str:
    if not isinstance(v, (int, float)) or not math.isfinite(v):
        return "-"
    return f"{v:.3f}" if v < 100 else f"{v:.1f}"


def fmt_duration(s: float | None) -> str:
    if s is None or s < 0:
        return "-"
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def point_or_all(p: Any) -> str:
    """A row's workload point (``io_struct.point_label``), or "all points" for a row about none."""
    return point_label(p) if isinstance(p, dict) else "all points"


def run_progress(run: Any, now: float | None = None) -> dict:
    """The live-progress document of a run (``/api/runs/{id}``): counters, phase and the share of
    its budget spent (1.0 once finished)."""
    now = time.time() if now is None else now
    budget = run.config.get("budget_s") if isinstance(run.config, dict) else None
    end = run.finished_at if run.finished_at is not None else now
    elapsed = max(0.0, end - run.created_at)
    if run.status != "running":
        fraction = 1.0
    elif isinstance(budget, (int, float)) and budget > 0:
        fraction = min(elapsed / float(budget), 0.99)
    else:
        fraction = None
    cfg = run.config if isinstance(run.config, dict) else {}
    counts = cfg.get("counts") or {}                     # the run's tally, once its plan is written
    return {"id": run.id, "status": run.status, "phase": run.message, "tried": run.candidates_tried,
            "accepted": run.candidates_accepted, "best_speedup": run.best_speedup,
            "kept": counts.get("kept"), "plan_speedup": (cfg.get("plan_speedup") or {}).get("slow"),
            "restarts": run.engine_restarts, "budget_s": budget, "elapsed_s": round(elapsed, 1),
            "fraction": None if fraction is None else round(fraction, 4),
            "updated_at": run.updated_at, "finished_at": run.finished_at}


def tiers_disagree(o: Any) -> bool:
    """An optimization (a board row with ``speedup_fast``/``speedup_slow``) whose tiers name different
    winners against the reference (``compiler.plan.report.tiers_disagree``)."""
    from compiler.plan.report import tiers_disagree as disagree

    return disagree(getattr(o, "speedup_fast", None), getattr(o, "speedup_slow", None))


# Characters that change how text reads without being seen: bidi embeddings, overrides and isolates
# (the "Trojan Source" trick: code that reads differently from what it does), zero-width characters,
# other format characters, and C0/C1 control characters but tab and newline. The UI shows each as a
# visible ``⟨U+202E⟩`` marker instead (in highlighted code, a marked span with a title).
INVISIBLE = re.compile("[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f\u00ad\u061c\u115f\u1160"
                       "\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u2028-\u202e\u2060-\u206f\u3164\ufe00-\ufe0f"
                       "\ufeff\uffa0\ufff9-\ufffb\U000e0000-\U000e007f]")


def marker(ch: str) -> str:
    return f"\u27e8U+{ord(ch):04X}\u27e9"


def visible(value: Any) -> Any:
    """Jinja2 ``finalize``: a string shown on a page with its invisible characters as markers (Markup,
    already escaped by whoever made it, passes unchanged)."""
    if isinstance(value, str) and not hasattr(value, "__html__"):
        return INVISIBLE.sub(lambda m: marker(m.group()), value)
    return value


def measured_on(run: Any) -> str:
    """The device a run's engines measured on (its board config: ``device``, ``device_name``), "?" unrecorded."""
    cfg = run.config if isinstance(getattr(run, "config", None), dict) else {}
    kind = cfg.get("device")
    return str(cfg.get("device_name") if kind == "cuda" and cfg.get("device_name") else kind or "?")


def hw_words(run: Any) -> str:
    """``on h200``, or ``projected for h200, measured on cpu`` when the run's target (``--hw``, what the
    cost model projects for) is not the device its engines measured on."""
    cfg = run.config if isinstance(getattr(run, "config", None), dict) else {}
    matches = cfg.get("matches_hw")
    if matches is None:                    # a run recorded before matches_hw: only a CPU run is known to differ
        matches = cfg.get("device") != "cpu" or str(run.hw).lower() == "cpu"
    return f"on {run.hw}" if matches else f"projected for {run.hw}, measured on {measured_on(run)}"


def result_status(post: Any) -> str:
    """The outcome a result post names (a config search's ``status``: "better", "not better"), or ""."""
    import json

    if getattr(post, "kind", None) != "result":
        return ""
    try:
        doc = json.loads(post.body)
    except (TypeError, ValueError):
        return ""
    return str(doc.get("status") or "") if isinstance(doc, dict) else ""


FILTERS = {"time": fmt_time, "speedup": fmt_speedup, "ms": fmt_ms, "duration": fmt_duration,
           "point": point_or_all, "tiers_disagree": tiers_disagree, "hw_words": hw_words,
           "measured_on": measured_on, "result_status": result_status}
