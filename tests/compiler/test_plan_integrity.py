"""Plans are content-addressed (issue 21): plan.json records the sha256 of every kernel file, and a plan
whose files were edited, removed, added or do not parse is refused by ``plan apply`` and ``recompile``
with one line naming the file (exit 2), and never executed."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from compiler.plan import artifact as plan_mod
from compiler.plan.compose import Part, compose
from plan_samples import make_plan
from persistent_engine.io_struct import WorkloadPoint

ROOT = Path(__file__).resolve().parents[2]
CONV = str(ROOT / "examples" / "traffic" / "azure2023_conv.csv")
CANDIDATES = Path(__file__).with_name("candidates")
POINTS = (WorkloadPoint(phase="decode", batch=2, context=40, chunk=1, weight=1.0),)


@pytest.fixture
def vdir(tmp_path):
    src = (CANDIDATES / "linear_fp32.py").read_text()
    opt = plan_mod.PlanOptimization(name="linear_fp32", targets=("linear",), speedup={"fast": 1.2, "slow": 1.1},
                                kernel="kernels/linear_fp32.py")
    return plan_mod.write_version(tmp_path / "plan", make_plan(optimizations=(opt,), workload_points=POINTS),
                                  sources={"kernels/linear_fp32.py": src},
                                  composed_source=compose([Part("linear_fp32", src)]), profile={"rows": 1})


def tkcc(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "compiler", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def test_plan_json_records_the_sha256_of_every_kernel_file(vdir):
    doc = json.loads((vdir / "plan.json").read_text())
    assert set(doc["kernel_sha256"]) == {"kernels/linear_fp32.py", "kernels/composed.py"}
    for rel, digest in doc["kernel_sha256"].items():
        assert plan_mod.sha256_file(vdir / rel) == digest
    plan, where = plan_mod.verify_plan_files(vdir.parent)
    assert where == vdir and plan.kernel_sha256 == doc["kernel_sha256"]


def _tamper(vdir: Path, how: str) -> str:
    composed = vdir / "kernels" / "composed.py"
    if how == "edited":
        # still correct Python, and it would leave a trace if it ever ran
        composed.write_text(composed.read_text() + f"\nopen({str(vdir / 'RAN')!r}, 'w').close()\n")
    elif how == "missing":
        composed.unlink()
    elif how == "added":
        (vdir / "kernels" / "extra.py").write_text("OVERRIDES = {}\n")
        return "extra.py"
    elif how == "syntax":                       # hashes re-recorded: a plan written broken, not edited
        composed.write_text("def broken(:\n")
        doc = json.loads((vdir / "plan.json").read_text())
        doc["kernel_sha256"]["kernels/composed.py"] = plan_mod.sha256_file(composed)
        (vdir / "plan.json").write_text(json.dumps(doc))
    elif how == "unhashed":
        doc = json.loads((vdir / "plan.json").read_text())
        del doc["kernel_sha256"]
        (vdir / "plan.json").write_text(json.dumps(doc))
        return "kernel hashes"
    return "composed.py"


@pytest.mark.parametrize("how", ["edited", "missing", "added", "syntax", "unhashed"])
def test_a_tampered_plan_is_refused_and_never_run(vdir, how):
    named = _tamper(vdir, how)
    with pytest.raises(plan_mod.PlanError, match=named):
        plan_mod.verify_plan_files(vdir)
    from compiler.plan.apply import load_plan_overrides
    with pytest.raises(plan_mod.PlanError, match=named):
        load_plan_overrides(vdir)
    assert not (vdir / "RAN").exists()


@pytest.mark.parametrize("how", ["edited", "syntax"])
def test_plan_apply_refuses_an_edited_kernel_with_exit_2(vdir, how):
    named = _tamper(vdir, how)
    r = tkcc("plan", "apply", "--plan", str(vdir))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0] and "Traceback" not in r.stderr
    assert not (vdir / "RAN").exists()


@pytest.mark.parametrize("how", ["missing", "syntax"])
def test_recompile_of_a_broken_plan_is_exit_2_not_no_drift(vdir, how):
    named = _tamper(vdir, how)
    r = tkcc("recompile", "--plan", str(vdir.parent), "--traffic", CONV)
    assert r.returncode == 2, r.stdout + r.stderr
    assert named in r.stderr and "no drift" not in r.stdout


def test_the_example_plans_verify():
    roots = sorted((ROOT / "examples" / "plans").glob("*/v*"))
    assert roots
    for v in roots:
        plan_mod.verify_plan_files(v)


@pytest.mark.slow
def test_plan_apply_runs_only_the_bytes_it_verified(vdir, monkeypatch):
    """A composed kernel swapped after ``plan.load`` checked it (before the engine reads it) is refused:
    ``check_plan`` hands the engine the bytes it hashed, never a second read of the file."""
    from compiler.plan import apply

    verified = plan_mod.load

    def load_then_swap(path):
        out = verified(path)
        (vdir / "kernels" / plan_mod.COMPOSED_KERNEL).write_text("OVERRIDES = {}\n")
        return out

    monkeypatch.setattr(apply.plan_mod, "load", load_then_swap)
    with pytest.raises(plan_mod.PlanError, match="composed.py does not match its sha256"):
        apply.check_plan(vdir, device="cpu", dtype="fp32")
