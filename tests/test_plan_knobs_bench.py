"""benchmarks/plan_knobs.py: a plan whose optimization came from the template library, re-rendered with a
knob set; the copy loads as a plan and runs in e2e_decode on the CPU; bad settings are one line, exit 2."""

import hashlib
import importlib.util
import json
import sys
from pathlib import Path

from agents.templates import Choice, get_template, render_candidate
from compiler.plan import apply as plan_apply
from compiler.plan import artifact as plan_mod
from compiler.plan.compose import Part, compose
from persistent_engine.io_struct import WorkloadPoint

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "plan_knobs.py"
spec = importlib.util.spec_from_file_location("plan_knobs_under_test", SCRIPT)
pk = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = pk
spec.loader.exec_module(pk)

NAME = "fused_add_rms_norm.torch_fused"


def template_plan(root: Path, impl: str = "fp32_add", description: str | None = None) -> Path:
    """A plan version whose one optimization is ``NAME`` rendered with TFARN_IMPL=impl, CONFIG kept."""
    choice = Choice(get_template(NAME), {"TFARN_IMPL": impl})
    source = render_candidate([choice], config={"kv_block_size": 8})
    opt = plan_mod.PlanOptimization(name="farn", targets=("fused_add_rms_norm",), speedup={"fast": 1.1, "slow": 1.1},
                                kernel="kernels/farn.py", author="test", description=description or choice.key())
    plan = plan_mod.Plan(
        model="tiny-dense", hw="cpu", detected_device={"kind": "cpu", "name": "x86_64"}, software={"torch": "x"},
        traffic={"source": "t", "hash": "h", "summary": {}},
        workload_points=(WorkloadPoint(phase="decode", batch=2, context=24, chunk=1, weight=1.0),),
        optimizations=(opt,), plan_speedup={"fast": 1.1, "slow": 1.1, "per_point": []},
        tiers={"fast": {"layers": [0]}, "slow": {"layers": [0, 1]}})
    return plan_mod.write_version(root, plan, sources={"kernels/farn.py": source},
                                  composed_source=compose([Part("farn", source, ("fused_add_rms_norm",),
                                                                ("kv_block_size",))]), profile=None)


def test_a_knob_set_by_pattern_is_rendered_into_a_loadable_copy(tmp_path, capsys):
    vdir = template_plan(tmp_path / "plan")
    assert pk.main(["--plan", str(vdir.parent), "--set", "TFARN_*=bf16_add", "--out", str(tmp_path / "v")]) == 0
    dest = tmp_path / "v" / vdir.name
    assert f"wrote {dest}" in capsys.readouterr().out
    composed = (dest / "kernels" / "composed.py").read_text()
    assert "TFARN_IMPL = 'bf16_add'" in composed and "'fp32_add'" not in composed.split("DESCRIPTION")[0]
    meta = json.loads((dest / "plan_knobs.json").read_text())
    assert meta["set"] == {"TFARN_IMPL": "bf16_add"} and meta["choices"] == [f"{NAME}{{TFARN_IMPL=bf16_add}}"]
    loaded = plan_apply.load(dest)                                   # loads as the plan does
    assert set(loaded.overrides) == {"fused_add_rms_norm"} and loaded.config == {"kv_block_size": 8}
    old, new = (json.loads((d / "plan.json").read_text()) for d in (vdir, dest))
    assert new.pop("kernel_sha256")["kernels/composed.py"] == hashlib.sha256(composed.encode()).hexdigest()
    old.pop("kernel_sha256")
    assert new == old                                                # only the re-rendered kernel's hash changed
    # and runs end to end on the CPU
    spec_e2e = importlib.util.spec_from_file_location("e2e_for_knobs", SCRIPT.parent / "e2e_decode.py")
    e2e = importlib.util.module_from_spec(spec_e2e)
    sys.modules[spec_e2e.name] = e2e
    spec_e2e.loader.exec_module(e2e)
    out = tmp_path / "r.json"
    assert e2e.main(["--device", "cpu", "--no-compile", "--samples", "2", "--eager-samples", "2", "--cases",
                     "tiny-dense:all@2/24", "--plan", str(dest), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["cases"][0]["agree"]


def test_bad_settings_and_foreign_plans_are_one_line_exit_2(tmp_path, capsys):
    vdir = template_plan(tmp_path / "plan")
    cases = [(["--set", "NO_SUCH_*=1"], "no knob of the plan's templates matches NO_SUCH_*"),
             (["--set", "TFARN_IMPL=fp16_add"], "TFARN_IMPL='fp16_add' not in"),
             (["--set", "TFARN_IMPL"], "expected PATTERN=VALUE")]
    for extra, message in cases:
        assert pk.main(["--plan", str(vdir), "--out", str(tmp_path / "x"), *extra]) == 2
        err = capsys.readouterr().err
        assert err.startswith("plan_knobs: ") and message in err and err.count("\n") == 1, err
    hand = template_plan(tmp_path / "hand", description="fused_add_rms_norm in fp32, written by hand")
    assert pk.main(["--plan", str(hand), "--set", "TFARN_IMPL=bf16_add", "--out", str(tmp_path / "y")]) == 2
    assert "not rendered from the template library" in capsys.readouterr().err
    assert pk.main(["--plan", str(tmp_path / "none"), "--set", "A=1", "--out", str(tmp_path / "z")]) == 2
    assert not (tmp_path / "x").exists() or not any((tmp_path / "x").iterdir())   # nothing half-written
