"""LLM-written (or unknown-author) candidates are refused where the executor sandbox is incomplete,
unless --unsafe-no-sandbox: one clear line, exit 2, nothing started."""

import pytest

from compiler.search.agent_spec import writes_llm_code
from compiler.cli import main
from persistent_engine.executor import sandbox

WEAK = sandbox.SandboxCapabilities(rlimits=True, no_new_privs=True, subreaper=True)


@pytest.fixture()
def weak_sandbox(monkeypatch):
    monkeypatch.setattr(sandbox, "probe", lambda: WEAK)


def test_agent_specs_that_write_llm_code():
    assert writes_llm_code("anthropic:2") and writes_llm_code("offline:4, openai:1")
    assert not writes_llm_code("offline:4") and not writes_llm_code("files:/x") and not writes_llm_code(None)


def test_candidate_check_refused_without_sandbox(weak_sandbox, tmp_path, capsys):
    f = tmp_path / "c.py"
    f.write_text("import os\nOVERRIDES = {}\n")           # refused statically: no engine either way
    assert main(["candidate", "check", str(f), "--model", "tiny-dense", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "--unsafe-no-sandbox" in err and "sandbox is incomplete" in err and "Traceback" not in err
    assert main(["candidate", "check", str(f), "--model", "tiny-dense", "--device", "cpu",
                 "--unsafe-no-sandbox"]) == 1                 # past the gate: judged (and rejected)


def test_optimize_with_llm_agents_refused_without_sandbox(weak_sandbox, tmp_path, capsys):
    args = ["optimize", "--model", "tiny-dense", "--hw", "cpu", "--traffic", str(tmp_path / "none.parquet"),
            "--agents", "anthropic:1", "--out", str(tmp_path / "plans")]
    assert main(args) == 2
    assert "LLM-written candidates are refused" in capsys.readouterr().err
    assert not (tmp_path / "plans").exists()
