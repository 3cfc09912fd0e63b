"""Inline SVG charts rendered on the server (no JavaScript, no CDN): the best speedup of a
deployment over time, and the time-per-op breakdown before and after its accepted optimizations.

Both return ``markupsafe.Markup``; every label drawn from the board is escaped. Cost: O(points).
The op breakdown "after" is an estimate from the measured per-point speedups (see
:func:`op_breakdown`); the chart says so.
"""

from __future__ import annotations

import math
import time
from html import escape
from typing import Any, Iterable, Sequence

from markupsafe import Markup

from bulletin_board import HistoryPoint
from compiler.plan.op_time import op_ms_per_step, point_weights, step_mix
from compiler.plan.plots import bar_chart
from persistent_engine import point_key

_FONT = 'font-family="system-ui,Helvetica,Arial,sans-serif"'


def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / n
    e = 10 ** math.floor(math.log10(raw))
    step = next(m * e for m in (1, 2, 2.5, 5, 10) if m * e >= raw)
    first = math.floor(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 2)]


def speedup_history_chart(points: Sequence[HistoryPoint], *, width: int = 760,
                          height: int = 300) -> Markup:
    """Each accepted optimization as a dot (time, speedup) and the running best as a step line."""
    if not points:
        return Markup('<p class="muted">No accepted optimization yet.</p>')
    left, right, top, bottom = 56, 20, 24, 44
    pw, ph = width - left - right, height - top - bottom
    t0, t1 = points[0].at, points[-1].at
    if t1 - t0 < 1.0:
        t0, t1 = t0 - 30.0, t1 + 30.0
    ymin = min(1.0, min(p.speedup for p in points))
    ticks = _nice_ticks(ymin, max(p.speedup for p in points) * 1.02)
    y_lo, y_hi = ticks[0], ticks[-1]

    def at(t: float, s: float) -> tuple[float, float]:
        return (left + pw * (t - t0) / (t1 - t0), top + ph * (1 - (s - y_lo) / (y_hi - y_lo)))

    out = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" {_FONT} font-size="11" role="img" '
           f'aria-label="best speedup over time">']
    for v in ticks:
        _, y = at(t0, v)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" stroke="#e3e3e3"/>'
                   f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{v:g}x</text>')
    for k in range(5):
        t = t0 + (t1 - t0) * k / 4
        x, _ = at(t, y_lo)
        fmt = "%H:%M:%S" if t1 - t0 < 3600 else "%H:%M" if t1 - t0 < 86400 else "%m-%d %H:%M"
        out.append(f'<text x="{x:.1f}" y="{height - bottom + 16}" text-anchor="middle">'
                   f'{time.strftime(fmt, time.gmtime(t))}</text>')
    if y_lo <= 1.0 <= y_hi:
        _, y = at(t0, 1.0)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" stroke="#888" '
                   f'stroke-dasharray="4,3"/>')
    best, path = -math.inf, []
    for p in points:
        if p.speedup > best:
            x, y = at(p.at, p.speedup)
            path.append(f"H{x:.1f} V{y:.1f}" if path else f"M{x:.1f},{y:.1f}")
            best = p.speedup
    path.append(f"H{at(t1, best)[0]:.1f}")
    out.append(f'<path d="{" ".join(path)}" fill="none" stroke="#E45756" stroke-width="2"/>')
    for p in points:
        x, y = at(p.at, p.speedup)
        out.append(f'<a href="/optimizations/{int(p.id)}"><circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" '
                   f'fill="#4C78A8"><title>{escape(p.name)}: {p.speedup:.3f}x</title></circle></a>')
    out.append(f'<text x="{left}" y="{height - 6}" fill="#555">UTC · dots: accepted optimizations · '
               f'red: best so far ({best:.3f}x)</text></svg>')
    return Markup("".join(out))


def _ms(v: Any) -> float | None:
    if isinstance(v, (int, float)) and math.isfinite(v):
        return float(v)
    if isinstance(v, dict):                # a profile's op entry {"ms", "calls", "share"}
        return _ms(v.get("ms"))
    return None


def op_breakdown(baseline: dict, optimizations: Iterable[Any]) -> tuple[dict[str, float], dict[str, float]]:
    """Per-op milliseconds of the traffic's mean step (``compiler.plan.op_time``, the report's weighting)
    before and after, estimated.

    Of several optimizations with the same targets only the fastest counts (the plan composes
    one). ``baseline`` is a run's baseline profile (``{"per_point": [{"point", "step_ms", "ops": {op:
    {"ms", ...}}}]}``). For each point and each optimization, the measured step speedup ``s`` at
    that point (``per_point[...]["fast"]``, else the optimization's overall speedup) saves
    ``step_ms * (1 - 1/s)``; the saving is taken off the optimization's target ops in proportion
    to their time (never below zero)."""
    rows = baseline.get("per_point") if isinstance(baseline, dict) else None
    if not isinstance(rows, list) or not rows:
        return {}, {}
    best: dict[tuple, Any] = {}          # a plan composes one override per op: the fastest one
    for o in optimizations:
        s = o.speedup_slow if o.speedup_slow is not None else o.speedup_fast
        k = tuple(sorted(o.targets))
        cur = best.get(k)
        if s is not None and (cur is None or s > (cur.speedup_slow if cur.speedup_slow is not None
                                                   else cur.speedup_fast or 0.0)):
            best[k] = o
    opts = list(best.values())
    befores, afters, steps = [], [], []
    for row in rows:
        point = row.get("point") or {}
        ops = {op: m for op, v in (row.get("ops") or {}).items() if (m := _ms(v)) is not None}
        step = _ms(row.get("step_ms")) or sum(ops.values())
        now = dict(ops)
        for o in opts:
            s = None
            for pp in o.per_point or ():
                if isinstance(pp, dict) and point_key(pp) == point_key(point):
                    s = pp.get("fast") if pp.get("fast") is not None else pp.get("slow")
            if s is None:
                s = o.speedup_fast if o.speedup_fast is not None else o.speedup_slow
            targets = [t for t in o.targets if t in now]
            if not s or s <= 0 or not targets:
                continue
            saved = step * (1.0 - 1.0 / float(s))
            total = sum(now[t] for t in targets) or 1.0
            for t in targets:
                now[t] = max(0.0, now[t] - saved * now[t] / total)
        befores.append(ops)
        afters.append(now)
        steps.append(step)
    mix = step_mix(point_weights([row.get("point") or {} for row in rows]), steps)
    return op_ms_per_step(mix, befores), op_ms_per_step(mix, afters)


def op_breakdown_chart(before: dict[str, float], after: dict[str, float], *, top: int = 12) -> Markup:
    """Horizontal bars, before and after, for the ``top`` costliest ops."""
    if not before:
        return Markup('<p class="muted">No baseline profile recorded yet.</p>')
    ops = sorted(before, key=lambda k: -before[k])[:top]
    svg = bar_chart("time per op, mean step of the traffic (points weighted as in the workload table)", ops,
                    {"before (measured)": [before[o] for o in ops],
                     "after (estimated from accepted speedups)": [after.get(o, before[o]) for o in ops]},
                    unit=" ms", width=760)
    return Markup(svg.replace("<svg ", '<svg class="chart" role="img" ', 1))
