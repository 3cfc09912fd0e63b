import importlib.util
import json
import subprocess
import sys

from compiler.cli import main


def test_doctor_screen_lists_devices_versions_and_parts(capsys, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-secret-value-123")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert main(["doctor"]) == 0
    out = capsys.readouterr()
    import torch
    assert f"torch {torch.__version__}" in out.out and "devices:" in out.out and "cpu" in out.out
    for part in ("psycopg", "ray", "anthropic", "openai"):
        assert part in out.out
    assert "ANTHROPIC_API_KEY set" in out.out and "OPENAI_API_KEY not set" in out.out
    assert "sk-secret-value-123" not in out.out + out.err
    assert len(out.out.splitlines()) < 30                                # one screen


def test_doctor_json(capsys, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k-hidden")
    monkeypatch.setenv("OPENAI_API_KEY", "")
    assert main(["doctor", "--json"]) == 0
    text = capsys.readouterr().out
    r = json.loads(text)
    assert r["versions"]["torch"] and r["devices"][0]["kind"] == "cpu"
    assert r["api_keys"]["OPENAI_API_KEY"] is False and r["api_keys"]["ANTHROPIC_API_KEY"] is True
    assert "k-hidden" not in text
    assert r["optional"]["psycopg"]["present"] == (importlib.util.find_spec("psycopg") is not None)
    assert set(r["required"]) >= {"torch", "triton", "pyzmq", "msgpack"}


def test_tkcc_doctor_console_entry():
    out = subprocess.run([sys.executable, "-m", "compiler", "doctor"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "optional parts:" in out.stdout and "Traceback" not in out.stderr


def test_doctor_reports_the_llm_sdks_and_keys_truthfully(capsys, monkeypatch):
    import importlib.metadata

    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-hidden")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    assert main(["doctor", "--json"]) == 0
    text = capsys.readouterr().out
    sdks = json.loads(text)["llm_sdks"]
    for sdk in ("anthropic", "openai"):
        assert sdks[sdk]["installed"] and sdks[sdk]["version"] == importlib.metadata.version(sdk)
    assert sdks["openai"]["key_set"] and sdks["openai"]["base_url_set"]
    assert not sdks["anthropic"]["key_set"] and not sdks["anthropic"]["base_url_set"]
    assert "sk-openai-hidden" not in text and "127.0.0.1:9" not in text
    assert main(["doctor"]) == 0
    screen = capsys.readouterr().out
    assert f"openai     installed {importlib.metadata.version('openai')}" in screen
    assert "OPENAI_API_KEY set, custom endpoint" in screen and "ANTHROPIC_API_KEY not set" in screen


def test_doctor_says_when_an_sdk_cannot_be_imported():
    code = ("import sys; sys.modules['anthropic'] = None\n"
            "from compiler.cli import main; main(['doctor', '--json'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    sdks = json.loads(out.stdout)["llm_sdks"]
    assert sdks["anthropic"] == {**sdks["anthropic"], "installed": False, "version": None}
    assert sdks["openai"]["installed"]


def test_doctor_reports_the_sandbox(capsys, monkeypatch):
    """The screen names the mechanisms in force; an incomplete sandbox is said so, with the flag."""
    from compiler.commands import doctor as cmd_doctor
    from persistent_engine.executor import sandbox
    probed = sandbox.probe()
    assert main(["doctor", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)["sandbox"]
    assert r["mechanisms"] == probed.as_dict() and r["complete"] == probed.complete()
    weak = sandbox.SandboxCapabilities(rlimits=True, no_new_privs=True, subreaper=True, seccomp=True,
                                       errors=(("landlock", "ENOSYS"),))
    monkeypatch.setattr(sandbox, "probe", lambda device="cpu": weak)
    out = cmd_doctor.render(cmd_doctor.collect())
    assert "executor sandbox: INCOMPLETE on cpu" in out and "--unsafe-no-sandbox" in out
    assert "writes (needs readonly_root or landlock_fs)" in out and "cpu landlock: ENOSYS" in out


def test_doctor_reports_both_policies_per_mechanism(capsys):
    """The CPU and the CUDA policies, probed here without a GPU: the host-facing mechanisms (uid, tmpfs
    workdir, hidden dirs and socket dirs, memory cgroup) each say whether they held, and why not."""
    from persistent_engine.executor import sandbox
    assert main(["doctor", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)["sandbox"]
    for device, got in (("cpu", r), ("cuda", r["cuda"])):
        caps = sandbox.probe(device)
        assert got["mechanisms"] == caps.as_dict() and got["errors"] == dict(caps.errors)
        for mech in ("unprivileged_uid", "workdir_tmpfs", "hidden_dirs", "socket_dirs_hidden", "memory_cgroup"):
            assert isinstance(got["mechanisms"][mech], bool)
    assert r["mechanisms"]["seccomp_unix"] == sandbox.probe("cpu").seccomp
    assert not r["cuda"]["mechanisms"]["seccomp_unix"]
    assert main(["doctor"]) == 0
    text = capsys.readouterr().out
    assert "on cpu" in text and "on cuda" in text
    assert ("not on cuda: " in text) and "seccomp_unix" in text.split("not on cuda: ")[1].splitlines()[0]
