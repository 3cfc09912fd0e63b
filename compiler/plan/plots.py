"""Dependency-free SVG charts for the plan report (matplotlib is not a tkcc dependency).

Two chart kinds cover the report: grouped horizontal bars (speedup per workload point, time per op
before/after) and a scatter with a highlighted front (parallelism Pareto). Output is a standalone
SVG string that Markdown viewers render through ``![title](plots/x.svg)``. Every series or point kind
drawn has an entry in the chart's legend (``<g class="legend">``), wrapped onto more rows when it is wider
than the chart.
"""

from __future__ import annotations

import math
from html import escape

PALETTE = ("#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2")
_FONT = 'font-family="Helvetica,Arial,sans-serif"'


def _fmt(v: float) -> str:
    if v == 0 or not math.isfinite(v):
        return "0" if v == 0 else str(v)
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def _nice_max(v: float) -> float:
    """A round axis end at or above ``v`` (1, 2, 2.5, 5 x 10^k)."""
    if v <= 0 or not math.isfinite(v):
        return 1.0
    e = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if m * e >= v:
            return m * e
    return 10 * e


def text_width(text: str, size: int = 12) -> float:
    """Estimated width in px of ``text`` at font ``size`` (Helvetica averages ~0.58 em a character)."""
    return 0.58 * size * len(text)


def legend(entries: list[tuple[str, str]], x0: float, y0: float, width: float) -> tuple[str, float]:
    """A legend of (name, colour) entries from (x0, y0), wrapped at ``width``: its SVG group and the y
    below its last row. Swatch 10 px, 14 px to the text, 18 px between entries, 16 px a row."""
    out, x, y = ['<g class="legend">'], x0, y0
    for name, color in entries:
        w = 14 + text_width(name) + 18
        if x > x0 and x + w > width:
            x, y = x0, y + 16
        out.append(f'<rect x="{x:.1f}" y="{y}" width="10" height="10" fill="{color}"/>'
                   f'<text x="{x + 14:.1f}" y="{y + 9}">{escape(name)}</text>')
        x += w
    out.append("</g>")
    return "".join(out), y + 16


def bar_chart(title: str, labels: list[str], series: dict[str, list[float]], *, unit: str = "",
              reference: float | None = None, width: int = 720) -> str:
    """Grouped horizontal bars: one group per label, one bar per series, each series in the legend.
    ``reference`` draws a dashed vertical line (e.g. speedup 1.0). Size: 14 px per bar + margins."""
    names = list(series)
    bar_h, gap = 14, 8
    group_h = bar_h * len(names) + gap
    left, right = 210, 70
    key, key_end = legend([(n, PALETTE[i % len(PALETTE)]) for i, n in enumerate(names)], 16, 28, width - 10)
    top = key_end + 4
    height = top + group_h * len(labels) + 40
    plot_w = width - left - right
    vmax = _nice_max(max([v for vs in series.values() for v in vs if v is not None and math.isfinite(v)]
                         + [reference or 0.0, 1e-12]))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" {_FONT} font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="15" font-weight="bold">'
           f'{escape(title)}</text>', key]
    for t in range(5):                     # grid and axis ticks
        v = vmax * t / 4
        x = left + plot_w * t / 4
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{height - 34}" stroke="#ddd"/>'
                   f'<text x="{x:.1f}" y="{height - 20}" text-anchor="middle">{_fmt(v)}{escape(unit)}</text>')
    for g, label in enumerate(labels):
        y0 = top + g * group_h
        out.append(f'<text x="{left - 6}" y="{y0 + group_h / 2 + 2:.1f}" text-anchor="end">'
                   f'{escape(label[:32])}</text>')
        for i, name in enumerate(names):
            v = series[name][g]
            if v is None or not math.isfinite(v):
                continue
            w = max(plot_w * v / vmax, 0.5)
            y = y0 + i * bar_h
            out.append(f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar_h - 2}" '
                       f'fill="{PALETTE[i % len(PALETTE)]}"><title>{escape(name)}: {_fmt(v)}</title></rect>'
                       f'<text x="{left + w + 4:.1f}" y="{y + bar_h - 4}" font-size="10">{_fmt(v)}</text>')
    if reference is not None:
        x = left + plot_w * reference / vmax
        out.append(f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{height - 34}" '
                   f'stroke="#333" stroke-dasharray="4,3"/>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def scatter_chart(title: str, points: list[tuple[float, float, str, bool]], *, x_label: str,
                  y_label: str, note: str = "", front_name: str = "Pareto front", other_name: str = "other points",
                  width: int = 720, height: int = 440) -> str:
    """Scatter of (x, y, label, highlighted); highlighted points are joined as a front (sorted by x) and
    labelled (a label that would overlap one drawn before it is left to the point's tooltip); the legend
    names both kinds drawn. ``note``: a line under the title (what the figures are)."""
    kinds = [(front_name, PALETTE[1])] * any(p[3] for p in points) + [(other_name, PALETTE[0])] * any(
        not p[3] for p in points)
    key, key_end = legend(kinds, 16, 46 if note else 30, width - 10)
    left, right, top, bottom = 70, 30, key_end + 6, 50
    pw, ph = width - left - right, height - top - bottom
    xs = [p[0] for p in points] or [1.0]
    ys = [p[1] for p in points] or [1.0]
    xmax, ymax = _nice_max(max(xs)), _nice_max(max(ys))

    def at(x: float, y: float) -> tuple[float, float]:
        return left + pw * x / xmax, top + ph * (1 - y / ymax)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" {_FONT} font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="22" text-anchor="middle" font-size="15" font-weight="bold">'
           f'{escape(title)}</text>', key]
    if note:
        out.append(f'<text class="note" x="{width / 2}" y="38" text-anchor="middle" fill="#555">{escape(note)}</text>')
    for t in range(5):
        x, _ = at(xmax * t / 4, 0)
        _, y = at(0, ymax * t / 4)
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + ph}" stroke="#eee"/>'
                   f'<text x="{x:.1f}" y="{top + ph + 16}" text-anchor="middle">{_fmt(xmax * t / 4)}</text>'
                   f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" stroke="#eee"/>'
                   f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt(ymax * t / 4)}</text>')
    out.append(f'<text x="{left + pw / 2}" y="{height - 10}" text-anchor="middle">{escape(x_label)}</text>'
               f'<text x="16" y="{top + ph / 2}" text-anchor="middle" '
               f'transform="rotate(-90 16 {top + ph / 2})">{escape(y_label)}</text>')
    front = sorted((p for p in points if p[3]), key=lambda p: p[0])
    if len(front) > 1:
        path = " ".join(f"{at(x, y)[0]:.1f},{at(x, y)[1]:.1f}" for x, y, _, _ in front)
        out.append(f'<polyline points="{path}" fill="none" stroke="{PALETTE[1]}" stroke-width="2"/>')
    boxes: list[tuple[float, float, float, float]] = []      # drawn labels: x0, y0, x1, y1
    for x, y, label, hi in points:
        cx, cy = at(x, y)
        color = PALETTE[1] if hi else PALETTE[0]
        out.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="{5 if hi else 3.5}" fill="{color}" '
                   f'fill-opacity="{1 if hi else 0.6}"><title>{escape(label)}: '
                   f'{_fmt(x)}, {_fmt(y)}</title></circle>')
        box = (cx + 7, cy - 15, cx + 7 + text_width(label, 10), cy - 4)
        if hi and not any(box[0] < b[2] and b[0] < box[2] and box[1] < b[3] and b[1] < box[3] for b in boxes):
            boxes.append(box)
            out.append(f'<text x="{cx + 7:.1f}" y="{cy - 6:.1f}" font-size="10">{escape(label)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
