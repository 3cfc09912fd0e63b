"""Unit tests of the UI's pure parts: the highlighter (escaping, exact text round trip), the op
breakdown estimate, the speedup chart and the pager."""

from __future__ import annotations

import html
import re
from types import SimpleNamespace

import pytest

from compiler.ui import highlight
from compiler.ui.charts import op_breakdown, op_breakdown_chart, speedup_history_chart
from bulletin_board import HistoryPoint
from compiler.ui.views import pager, point_or_all, run_progress

HOSTILE = "<script>alert(1)</script>"


def text_of(markup: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", markup))


def test_highlight_round_trips_and_escapes():
    src = ('import torch\n\n@torch.compile\ndef rms_norm(x, weight, eps=1e-6):\n'
           f'    """{HOSTILE} & "quotes" \'single\'"""\n'
           '    v = x.float().pow(2).mean(-1, keepdim=True)  # </pre></code>\n'
           '    return (x * torch.rsqrt(v + eps)).to(x.dtype) * weight\n'
           f'NOTE = f"{{len(OVERRIDES)}} {HOSTILE}"\nOVERRIDES = {{"rms_norm": rms_norm}}\n')
    out = str(highlight(src))
    assert text_of(out) == src                          # nothing lost, nothing added
    assert "<script" not in out and "</pre>" not in out and "</code>" not in out
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in out
    tags = set(re.findall(r"<(/?\w+)", out))
    assert tags <= {"span", "/span"}                    # only our own spans
    assert '<span class="k">def</span> <span class="f">rms_norm</span>' in out
    assert '<span class="k">import</span>' in out
    assert '<span class="c"># &lt;/pre&gt;&lt;/code&gt;</span>' in out
    assert '<span class="n">1e-6</span>' in out
    assert '<span class="d">@</span><span class="d">torch</span>' in out
    assert '<span class="b">len</span>' in out or '<span class="s">' in out   # f-string split is 3.12+


def test_highlight_broken_source_falls_back_to_escaped_text():
    for src in (f'x = "never closed\n{HOSTILE}\n', "def f(:\n\tpass\n  bad\n", f"'''{HOSTILE}", ""):
        out = str(highlight(src))
        assert text_of(out) == src
        assert "<script" not in out


def _opt(targets, fast, slow=None, per_point=()):
    return SimpleNamespace(targets=list(targets), speedup_fast=fast, speedup_slow=slow,
                           per_point=list(per_point))


def test_op_breakdown_takes_measured_saving_off_the_targets():
    base = {"per_point": [
        {"point": {"phase": "decode", "batch": 8, "context": 1024, "chunk": 1, "weight": 0.75},
         "step_ms": 10.0, "ops": {"linear": {"ms": 6.0}, "rms_norm": {"ms": 2.0}, "silu_and_mul": {"ms": 2.0}}},
        {"point": {"phase": "prefill", "batch": 1, "context": 0, "chunk": 512, "weight": 0.25},
         "step_ms": 20.0, "ops": {"linear": {"ms": 16.0}, "rms_norm": {"ms": 4.0}}}]}
    # 1.25x at the decode point saves 10 * (1 - 1/1.25) = 2 ms, all of it rms_norm's;
    # no figure at the prefill point: its overall 1.1x saves 20 * (1 - 1/1.1) = 1.818 ms
    rms = _opt(["rms_norm"], 1.1, None, [{"phase": "decode", "batch": 8, "context": 1024, "chunk": 1, "fast": 1.25}])
    worse_rms = _opt(["rms_norm"], 1.05, 1.02)          # same target, slower: not composed
    before, after = op_breakdown(base, [rms, worse_rms])
    # the traffic's mean step (compiler.plan.op_time): 0.75 / 10 ms decode steps per 0.25 / 20 ms prefill steps
    f_d, f_p = 6 / 7, 1 / 7
    assert before == pytest.approx({"linear": f_d * 6 + f_p * 16, "rms_norm": f_d * 2 + f_p * 4,
                                    "silu_and_mul": f_d * 2}, abs=1e-6)
    assert abs(after["rms_norm"] - (f_d * 0.0 + f_p * (4 - 20 * (1 - 1 / 1.1)))) < 1e-6
    assert after["linear"] == before["linear"] and after["silu_and_mul"] == before["silu_and_mul"]
    # a saving larger than the op's time never goes below zero
    _, after2 = op_breakdown(base, [_opt(["silu_and_mul"], 3.0)])
    assert after2["silu_and_mul"] == 0.0
    assert op_breakdown({}, [rms]) == ({}, {})
    svg = str(op_breakdown_chart(before, after))
    assert svg.startswith("<svg") and "rms_norm" in svg and "estimated" in svg


def test_speedup_chart_escapes_names_and_draws_running_best():
    pts = [HistoryPoint(1000.0, 1.1, "a", 1), HistoryPoint(1060.0, 1.05, HOSTILE, 2),
           HistoryPoint(1120.0, 1.3, "c", 3)]
    svg = str(speedup_history_chart(pts))
    assert HOSTILE not in svg and "&lt;script&gt;" in svg
    assert svg.count("<circle") == 3 and 'href="/optimizations/3"' in svg
    assert "best so far (1.300x)" in svg
    assert "No accepted" in str(speedup_history_chart([]))


def test_pager_and_labels():
    pg = pager("/optimizations", {"sort": "-date", "page": "3", "op": ""}, 3, 20, total=45)
    assert (pg.offset, pg.pages, pg.has_prev, pg.has_next) == (40, 3, True, False)
    assert pg.link(2) == "/optimizations?sort=-date&page=2" and pg.link(1) == "/optimizations?sort=-date"
    assert pager("/", {}, 1, 10_000).per_page == 200
    assert point_or_all({"phase": "prefill", "batch": 1, "context": 0, "chunk": 512}) == "prefill b1 ctx0 chunk512"
    assert point_or_all(None) == "all points"
    run = SimpleNamespace(id=1, status="running", message="searching", config={"budget_s": 100},
                          created_at=1000.0, finished_at=None, candidates_tried=3, candidates_accepted=1,
                          best_speedup=1.2, engine_restarts=0, updated_at=1010.0)
    assert run_progress(run, now=1050.0)["fraction"] == 0.5
    done = SimpleNamespace(**{**vars(run), "status": "done", "finished_at": 1080.0})
    assert run_progress(done, now=5000.0)["fraction"] == 1.0 and run_progress(done)["elapsed_s"] == 80.0
