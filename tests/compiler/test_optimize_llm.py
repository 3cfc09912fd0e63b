"""``tkcc optimize --agents anthropic:2,openai:2,offline:4`` end to end on tiny-dense (CPU, real engines)
with the LLM agents talking to the scripted server through the real SDK clients (endpoints and keys from
the environment, as a user sets them): every LLM agent reads the roofline and the other agents'
candidates, posts an idea and submits a candidate that is judged by the engines; the report and the run's
board record show tokens, cost, candidates and acceptances per agent. A missing key is one line, exit 2."""

from pathlib import Path

import pytest

from agents.testing import ScriptedLLMServer
from compiler.cli import main

ROOT = Path(__file__).resolve().parents[2]
CONV = str(ROOT / "examples" / "traffic" / "azure2023_conv.csv")
CANDIDATE = '''"""silu_and_mul as one expression."""
import torch

DESCRIPTION = "silu(gate) * up in one expression"


def silu_and_mul(x):
    half = x.shape[-1] // 2
    return torch.nn.functional.silu(x[..., :half]) * x[..., half:]


OVERRIDES = {"silu_and_mul": silu_and_mul}
'''
MODELS = {"anthropic": "claude-sonnet-4-6", "openai": "gpt-4.1"}
PRICE = {"anthropic": (3.0, 15.0, 0.1), "openai": (2.0, 8.0, 0.5)}      # $/Mtok in, out; cache-read factor


def conversation(agent: str) -> list[dict]:
    return [
        {"tool_calls": [{"name": "read_roofline", "input": {}}], "usage": {"input": 1500, "output": 40}},
        {"tool_calls": [{"name": "read_candidates", "input": {"verdict": "any"}}], "expect": ["roofline_ms"],
         "usage": {"input": 300, "output": 30, "cached": 1500}},
        {"tool_calls": [{"name": "post_idea", "input": {"title": f"one-expression silu_and_mul ({agent})",
                                                        "target": "silu_and_mul", "body": "no temporaries"}}],
         "usage": {"input": 400, "output": 90, "cached": 1800}},
        {"tool_calls": [{"name": "submit_candidate", "input": {"source": CANDIDATE + f"# by {agent}\n"}}],
         "expect": ["holding"], "usage": {"input": 200, "output": 400, "cached": 2200}},
        {"text": "One expression is correct; the gain is small at these sizes.", "expect": ['"correct":true'],
         "usage": {"input": 300, "output": 30, "cached": 2600}},
    ]


def expected_usage(kind: str) -> tuple[int, int, int, float]:
    """(input, cached, output, dollars) of one agent: its conversation plus the closing turn of its next
    cycle (the server's default usage: 100 in, 50 out)."""
    steps = conversation("x")
    i = sum(s["usage"]["input"] for s in steps) + 100
    c = sum(s["usage"].get("cached", 0) for s in steps)
    o = sum(s["usage"]["output"] for s in steps) + 50
    p_in, p_out, f = PRICE[kind]
    return i, c, o, (i * p_in + c * p_in * f + o * p_out) / 1e6


@pytest.mark.slow
def test_optimize_with_llm_and_offline_agents_end_to_end(tmp_path, monkeypatch, capsys):
    names = [f"{k}-{i}" for k in ("anthropic", "openai") for i in range(2)]
    scripts = {f"{MODELS[n.split('-')[0]]}@{n}": conversation(n) for n in names}
    out = tmp_path / "plans"
    with ScriptedLLMServer(scripts) as srv:
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", srv.url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        monkeypatch.setenv("OPENAI_BASE_URL", srv.url + "/v1")
        monkeypatch.setenv("TKCC_ANTHROPIC_MODEL", MODELS["anthropic"])
        monkeypatch.setenv("TKCC_OPENAI_MODEL", MODELS["openai"])
        code = main(["optimize", "--model", "tiny-dense", "--hw", "h200", "--traffic", CONV, "--budget", "75s",
                     "--agents", "anthropic:2,openai:2,offline:4", "--max-points", "1", "--aa-runs", "1",
                     "--out", str(out), "--quiet", "--llm-budget-usd", "5"])
        assert code == 0
        assert srv.protocol_errors == [] and all(srv.remaining(k) == 0 for k in scripts)
    summary = capsys.readouterr().out
    for n in names:                                   # one line per LLM agent after the plan's summary
        i, c, o, dollars = expected_usage(n.split("-")[0])
        assert f"  {n}: {i + c + o} tokens, ${dollars:.4f}, 1 candidates" in summary

    vdir = out / "v1"
    report = (vdir / "report.md").read_text()
    table = report[report.index("## Agents"):]
    rows = {ln.split("|")[1].strip(): [c.strip() for c in ln.split("|")[2:-1]]
            for ln in table.splitlines() if ln.startswith("| ") and not ln.startswith("| agent")}
    assert set(names) <= set(rows) and sum(n.startswith("offline") for n in rows) == 4
    for n in names:
        cycles, tried, correct, accepted, i, c, o, cost, stopped = rows[n]
        want_i, want_c, want_o, want_cost = expected_usage(n.split("-")[0])
        assert (int(tried), int(correct), int(i), int(c), int(o)) == (1, 1, want_i, want_c, want_o)
        assert cost == f"${want_cost:.4f}" and int(accepted) in (0, 1) and stopped == "exhausted"
    assert any(int(rows[n][1]) > 0 for n in rows if n.startswith("offline"))    # the offline agents searched
    assert "LLM spend:" in table

    from bulletin_board import Board
    with Board(f"sqlite:///{out / 'board.db'}", readonly=True) as board:
        run = board.list_runs().items[0]
        recorded = {r["name"]: r for r in run.config["agent_reports"]}
        assert recorded["anthropic-0"]["cost_usd"] == pytest.approx(expected_usage("anthropic")[3])
        llm = board.list_candidates(run, author_kind="llm").items
        assert sorted(c.author for c in llm) == sorted(names)
        assert all(board.list_evaluations(candidate=c.id).items[0].verdict == "correct" for c in llm)


def test_a_missing_key_is_one_line_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    code = main(["optimize", "--model", "tiny-dense", "--hw", "h200", "--traffic", CONV, "--budget", "30s",
                 "--agents", "anthropic:1,offline:1", "--out", str(tmp_path / "p"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "ANTHROPIC_API_KEY" in err and "anthropic:1" in err and "Traceback" not in err
    assert not (tmp_path / "p" / "v1").exists()


def test_llm_budgets_must_be_positive(tmp_path, capsys):
    code = main(["optimize", "--model", "tiny-dense", "--hw", "h200", "--traffic", CONV, "--llm-budget-usd", "0",
                 "--out", str(tmp_path / "p")])
    assert code == 2 and "--llm-budget-usd must be positive" in capsys.readouterr().err
