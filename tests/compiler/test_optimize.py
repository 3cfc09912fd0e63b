"""``tkcc optimize`` as a user runs it: SIGINT during the search still writes the plan of what was
accepted (a subprocess, a real signal); bad inputs are one line and exit 2."""

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from compiler.plan import artifact as plan_mod
from compiler.commands.optimize import UsageError, parse_duration, watchdog_s

ROOT = Path(__file__).resolve().parents[2]
CONV = str(ROOT / "examples" / "traffic" / "azure2023_conv.csv")
CANDIDATES = Path(__file__).with_name("candidates")


def tkcc(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "compiler", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


@pytest.mark.slow
def test_sigint_during_search_writes_the_plan(tmp_path):
    out = tmp_path / "plan"
    proc = subprocess.Popen([sys.executable, "-m", "compiler", "optimize", "--model", "tiny-dense", "--hw", "h200",
                             "--traffic", CONV, "--budget", "10m", "--agents", "offline:2", "--aa-runs", "1",
                             "--max-points", "1", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    lines: list[str] = []
    searching, accepted = threading.Event(), threading.Event()

    def pump():
        for line in proc.stderr:
            lines.append(line)
            if "phase: searching" in line:
                searching.set()
            if "] accepted " in line:
                accepted.set()
    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        assert searching.wait(240), "".join(lines[-20:])
        # interrupt right after a first acceptance, or 15 s into the search: on a loaded machine the noise
        # can block every acceptance, and the CPU templates' whole space is then searched in about a minute
        accepted.wait(15)
        sent_at = len(lines)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=240)
        stdout = proc.stdout.read()
        reader.join(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, "".join(lines[-20:])
    assert time.monotonic() - t0 < 240
    plan, vdir = plan_mod.load(out)
    assert plan.run["interrupted"] is True and plan.run["budget_s"] == 600
    assert "interrupted" in (vdir / "report.md").read_text()
    assert str(vdir / "report.md") in stdout
    assert any("interrupted: finishing" in line for line in lines)
    # each tier's engine reports the layer-level bound it calibrated (persistent_engine/verification/tolerance.py)
    assert any(line.startswith("[tkcc] fast engine (cpu, layers [") and "layer-level logits bound 0.0" in line
               for line in lines), "".join(lines[:12])
    for o in plan.optimizations:
        assert (vdir / o.kernel).is_file()
    before = "".join(lines[:sent_at])
    if "] accepted " in before and "phase: composing" not in before:
        assert plan.optimizations, "accepted before the Ctrl-C, so the plan must hold it"
        assert plan.plan_speedup["note"] == "interrupted: composition not re-measured"


@pytest.mark.parametrize("args, message", [
    (["--model", "no-such-model", "--hw", "h200", "--traffic", CONV], "unknown model"),
    (["--model", "tiny-dense", "--hw", "tpu9", "--traffic", CONV], "unknown hardware"),
    (["--model", "tiny-dense", "--hw", "h200", "--traffic", "/nonexistent.csv"], "traffic file not found"),
    (["--model", "tiny-dense", "--hw", "h200", "--traffic", CONV, "--budget", "soon"], "bad duration"),
    (["--model", "tiny-dense", "--hw", "h200", "--traffic", CONV, "--agents", "wizard:2"], "unknown agent kind"),
    (["--model", "tiny-moe", "--hw", "h200", "--traffic", CONV, "--routing-skew", "nan"], "--routing-skew must be"),
    (["--model", "tiny-moe", "--hw", "h200", "--traffic", CONV, "--routing-skew", "-1"], "--routing-skew must be"),
    (["--model", "tiny-moe", "--hw", "h200", "--traffic", CONV, "--routing-histogram", "/nonexistent.json"],
     "routing histogram not found"),
])
def test_bad_inputs_are_one_line_exit_2(tmp_path, args, message):
    r = tkcc("optimize", *args, "--out", str(tmp_path / "p"), "--quiet")
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "p").exists() or plan_mod.versions(tmp_path / "p") == []


def test_recompile_of_missing_plan_is_exit_2(tmp_path):
    r = tkcc("recompile", "--plan", str(tmp_path / "none"), "--traffic", CONV)
    assert r.returncode == 2 and "no plan at" in r.stderr and "Traceback" not in r.stderr


def test_parse_duration():
    assert parse_duration("90") == 90 and parse_duration("10m") == 600 and parse_duration("1.5h") == 5400
    with pytest.raises(UsageError):
        parse_duration("-3m")


def test_watchdog_defaults_to_a_third_of_the_budget_within_bounds(monkeypatch):
    assert watchdog_s(6 * 60) == 120 and watchdog_s(12 * 60) == 240 and watchdog_s(30 * 60) == 300
    assert watchdog_s(60) == 120
    import compiler.search.loop
    from compiler.cli import main

    seen = []

    def fake_optimize(cfg):
        seen.append(cfg.timeout_s)
        raise KeyboardInterrupt               # stop at the boundary: the CLI answers 130
    monkeypatch.setattr(compiler.search.loop, "optimize", fake_optimize)
    base = ["optimize", "--model", "tiny-dense", "--hw", "h200", "--traffic", CONV, "--quiet"]
    assert main(base + ["--budget", "12m"]) == 130 and main(base + ["--budget", "1m", "--timeout", "50"]) == 130
    assert seen == [240.0, 50.0]


def test_help_lists_commands():
    r = tkcc("--help")
    assert r.returncode == 0
    for cmd in ("optimize", "recompile", "plan"):
        assert cmd in r.stdout
    r = tkcc("plan", "apply", "--help")
    assert r.returncode == 0 and "--plan" in r.stdout


def test_a_cpu_run_says_triton_is_interpreted_and_a_checkpoint_dir_brings_its_weights(tmp_path):
    """Issue 46: ``optimize --model DIR`` on a checkpoint loads its weights on both tiers (said in the run's
    notes), and a CPU run says at start-up that Triton runs in its interpreter there."""
    import shutil

    from compiler.search import inputs
    from compiler.search.loop import OptimizeConfig, gather_inputs
    from persistent_engine.models.decoder import build_model
    from persistent_engine.models.spec import ALIASES, CONFIG_DIR
    from persistent_engine.models.weights import save_weights

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    shutil.copy(CONFIG_DIR / ALIASES["tiny-dense"], ckpt / "config.json")
    save_weights(build_model("tiny-dense", device="cpu", seed=3), ckpt / "model.safetensors")
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{i:02d}.0000000,{30 + i},{8 + i % 5}\n" for i in range(40)))
    got = gather_inputs(OptimizeConfig(model=str(ckpt), hw="cpu", traffic=str(trace), out=str(tmp_path / "p"),
                                       device="cpu"))
    assert inputs.INTERPRETER_NOTE in got.notes
    assert f"weights: the checkpoint at {ckpt} (not random)" in got.notes
    assert got.tier_inputs["fast"]["weights"] == got.tier_inputs["slow"]["weights"] == str(ckpt)
    plain = gather_inputs(OptimizeConfig(model="tiny-dense", hw="cpu", traffic=str(trace), out=str(tmp_path / "q"),
                                         device="cpu"))
    assert "weights" not in plain.tier_inputs["fast"] and inputs.RANDOM_WEIGHTS_NOTE in plain.notes
