"""Serving side: a plan's composed overrides load into the op registry and run the model; ``tkcc plan
apply`` checks them against the reference at the plan's workload points."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from compiler.plan import artifact as plan_mod
from compiler.plan.apply import apply_plan, check_plan, load_plan_overrides
from compiler.plan.compose import Part, compose
from plan_samples import make_plan
from persistent_engine.io_struct import WorkloadPoint

CANDIDATES = Path(__file__).with_name("candidates")
POINTS = (WorkloadPoint(phase="decode", batch=2, context=40, chunk=1, weight=0.6),
          WorkloadPoint(phase="prefill", batch=1, context=8, chunk=16, weight=0.4))


def write_plan(root, sources: dict[str, str]) -> Path:
    opts = tuple(plan_mod.PlanOptimization(name=n, targets=(), speedup={"fast": 1.2, "slow": 1.1},
                                       kernel=f"kernels/{n}.py") for n in sources)
    plan = make_plan(optimizations=opts, workload_points=POINTS)
    return plan_mod.write_version(root, plan, sources={f"kernels/{n}.py": s for n, s in sources.items()},
                                  composed_source=compose([Part(n, s) for n, s in sources.items()]),
                                  profile=None)


@pytest.fixture
def plan_dir(tmp_path):
    return write_plan(tmp_path, {n: (CANDIDATES / f"{n}.py").read_text() for n in ("linear_fp32", "fused_add_rms_norm_fp32")})


def test_overrides_load_and_are_active_only_inside_apply_plan(plan_dir):
    from persistent_engine.ops import registry

    overrides, config = load_plan_overrides(plan_dir.parent)
    assert set(overrides) == {"linear", "fused_add_rms_norm"} and config == {}
    with apply_plan(plan_dir, spot_check=0) as loaded:
        assert registry.current("linear") is loaded.overrides["linear"]
    with apply_plan(plan_dir) as loaded:                # spot-checked by default: the kernel behind a wrapper
        assert registry.current("linear").fn is loaded.overrides["linear"]
    assert registry.current("linear") is registry.get("linear").reference


def test_check_plan_matches_reference_on_the_model(plan_dir):
    loaded, checks = check_plan(plan_dir, repeats=2)
    assert [c.point for c in checks] == list(POINTS)
    assert all(c.ok and c.max_abs_reference > 0 and c.reference_ms > 0 and c.plan_ms > 0 for c in checks)


def test_a_wrong_plan_is_caught_by_plan_apply(tmp_path):
    wrong = ('import torch\n\n\ndef fused_add_rms_norm(x, residual, weight, eps):\n'
             '    return x * weight, x + residual\n\n\nOVERRIDES = {"fused_add_rms_norm": fused_add_rms_norm}\n')
    vdir = write_plan(tmp_path, {"wrong": wrong})
    r = subprocess.run([sys.executable, "-m", "compiler", "plan", "apply", "--plan", str(vdir), "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["ok"] is False and doc["ops"] == ["fused_add_rms_norm"]


def test_plan_apply_cli_ok(plan_dir):
    r = subprocess.run([sys.executable, "-m", "compiler", "plan", "apply", "--plan", str(plan_dir)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "overrides fused_add_rms_norm, linear" in r.stdout and "match the reference" in r.stderr


def test_plan_apply_vs_torch_compile_times_the_plan_against_compile_of_the_same_slice(plan_dir):
    r = subprocess.run([sys.executable, "-m", "compiler", "plan", "apply", "--plan", str(plan_dir), "--dtype", "fp32",
                        "--vs-torch-compile", "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    vs = json.loads(r.stdout)["vs_torch_compile"]
    assert vs["layers"] == [0] and vs["torch_compile_mode"] == "default" and vs["weight_covered"] == 1.0
    assert [p["point"] for p in vs["points"]] == [p.to_dict() for p in POINTS]
    assert all(p["plan_ms"] > 0 and p["torch_compile_ms"] > 0 and p["compile_s"] > 0 for p in vs["points"])
    assert vs["plan_vs_torch_compile"] == pytest.approx(vs["torch_compile_ms"] / vs["plan_ms"], rel=1e-3)


def test_plan_apply_runs_a_checkpoint_directorys_own_weights(plan_dir, tmp_path):
    """Issue 46: ``plan apply --model DIR`` (config.json beside safetensors) runs the checkpoint's weights and
    says so; without one they are seeded random (the empty-plan test below reads the words)."""
    import shutil

    import torch

    from persistent_engine.models.decoder import build_model
    from persistent_engine.models.spec import ALIASES, CONFIG_DIR
    from persistent_engine.models.weights import save_weights

    ckpt = tmp_path / "my-tiny-llama"
    ckpt.mkdir()
    shutil.copy(CONFIG_DIR / ALIASES["tiny-dense"], ckpt / "config.json")
    save_weights(build_model("tiny-dense", device="cpu", dtype=torch.float32, seed=7), ckpt / "model.safetensors")
    r = subprocess.run([sys.executable, "-m", "compiler", "plan", "apply", "--plan", str(plan_dir), "--model",
                        str(ckpt), "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["weights"] == str(ckpt) and doc["ok"]
    seeded = [p["max_abs_reference"] for p in doc["points"]]
    loaded, checks = check_plan(plan_dir, repeats=1)
    assert loaded.weights is None
    assert [c.max_abs_reference for c in checks] != seeded    # other weights, other logits


def test_an_empty_plan_applies_as_the_baseline_and_says_so(tmp_path):
    vdir = write_plan(tmp_path, {})
    assert (vdir / "kernels" / plan_mod.COMPOSED_KERNEL).is_file()
    r = subprocess.run([sys.executable, "-m", "compiler", "plan", "apply", "--plan", str(vdir)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "overrides none" in r.stdout and "holds no optimization" in r.stdout
    assert "weights: seeded random" in r.stdout
    assert "match the reference" in r.stderr


def test_broken_kernel_file_is_a_plan_error(tmp_path):
    """A kernel recorded with its hash that raises on import: one line, not a traceback."""
    vdir = write_plan(tmp_path, {"boom": "raise RuntimeError('boom')\n"})
    with pytest.raises(plan_mod.PlanError, match="fails to load: RuntimeError: boom"):
        load_plan_overrides(vdir)


def test_op_times_count_each_call_once_at_the_outermost_op():
    """The report's time-per-op table: a composite op's parts (called inside its default) are not
    counted again beside it, so the per-op times add up to one step."""
    from compiler.plan.apply import op_times_with
    from persistent_engine.models.spec import ModelSpec

    source = (CANDIDATES / "linear_fp32.py").read_text()
    times = op_times_with(ModelSpec.from_name("tiny-dense"), [0, 1], list(POINTS), source, reps=1)
    before, after = times["before"], times["after"]
    assert {"add_rms_norm_qkv_rotary", "silu_mul_linear", "attention_decode"} <= set(before)
    # rotary and silu_and_mul only run inside composites on tiny-dense; linear only as the o-projection
    assert "rotary_embedding" not in before and "silu_and_mul" not in before and "add_rms_norm_linear" in before
    assert set(after) == set(before) and all(v > 0 for v in before.values())
