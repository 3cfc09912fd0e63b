"""The plan artifact: versioned directories, atomic writes, validation with one-line errors."""

import json
import re
import subprocess
import sys

import pytest

from compiler.plan import artifact as plan_mod
from compiler.plan.report import render
from plan_samples import make_plan


def write(root, plan=None, **kw):
    plan = plan or make_plan()
    sources = {o.kernel: f"# {o.name}\nOVERRIDES = {{}}\n" for o in plan.optimizations}
    return plan_mod.write_version(root, plan, sources=sources, composed_source="OVERRIDES = {}\n",
                                  profile={"kind": "tkcc.traffic_profile", "rows": 10}, extra_files=render, **kw)


def test_versions_are_written_beside_each_other_and_round_trip(tmp_path):
    v1 = write(tmp_path)
    v2 = write(tmp_path, make_plan(parent_version=1))
    assert (v1.name, v2.name) == ("v1", "v2")
    assert plan_mod.versions(tmp_path) == [1, 2]
    loaded, vdir = plan_mod.load(tmp_path)          # the root resolves to the newest version
    assert vdir == v2 and loaded.version == 2 and loaded.parent_version == 1
    assert loaded == plan_mod.Plan.from_dict(json.loads((v2 / "plan.json").read_text()))
    assert loaded.optimizations[0].speedup == {"fast": 1.31, "slow": 1.12}
    assert plan_mod.load(v1)[0].version == 1
    assert plan_mod.load_profile(v1)["rows"] == 10
    assert (v1 / "kernels" / "composed.py").is_file() and (v1 / "kernels" / "offline_0_rms_norm_1.py").is_file()
    assert "v1" in (v1 / "report.md").read_text().splitlines()[0]


def test_failed_write_leaves_no_version_and_no_temp_dir(tmp_path):
    write(tmp_path)

    def broken(plan):
        raise RuntimeError("disk full")
    with pytest.raises(RuntimeError):
        plan_mod.write_version(tmp_path, make_plan(), sources={}, composed_source=None, profile=None, extra_files=broken)
    assert plan_mod.versions(tmp_path) == [1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v1"]


@pytest.mark.parametrize("mutate, message", [
    (lambda d: "{not json", "not valid JSON"),
    (lambda d: json.dumps({**d, "version": "one"}), "field 'version' should be int"),
    (lambda d: json.dumps({k: v for k, v in d.items() if k != "model"}), "missing field 'model'"),
    (lambda d: json.dumps({**d, "optimizations": [{"name": "x", "targets": [], "speedup": {"fast": 1.2}}]}),
     "needs numbers for 'fast' and 'slow'"),
    (lambda d: json.dumps({**d, "schema": "other/9"}), "unknown schema"),
])
def test_corrupt_plan_is_one_clear_error(tmp_path, mutate, message):
    vdir = write(tmp_path)
    doc = json.loads((vdir / "plan.json").read_text())
    (vdir / "plan.json").write_text(mutate(doc))
    with pytest.raises(plan_mod.PlanError) as e:
        plan_mod.load(tmp_path)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_missing_kernel_file_is_reported(tmp_path):
    vdir = write(tmp_path)
    (vdir / "kernels" / "offline_0_rms_norm_1.py").unlink()
    with pytest.raises(plan_mod.PlanError, match="kernel file kernels/offline_0_rms_norm_1.py is missing"):
        plan_mod.load(vdir)


def test_no_plan_messages(tmp_path):
    with pytest.raises(plan_mod.PlanError, match="does not exist"):
        plan_mod.load(tmp_path / "nope")
    with pytest.raises(plan_mod.PlanError, match="no plan.json"):
        plan_mod.load(tmp_path)


def test_cli_plan_show_corrupt_plan_exits_2_without_traceback(tmp_path):
    vdir = write(tmp_path)
    out = subprocess.run([sys.executable, "-m", "compiler", "plan", "show", str(tmp_path), "--json"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["version"] == 1
    (vdir / "plan.json").write_text("[]")
    out = subprocess.run([sys.executable, "-m", "compiler", "plan", "show", str(tmp_path)],
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert "corrupt plan" in out.stderr


def test_kernel_paths_are_content_addressed_and_safe():
    a, b = "OVERRIDES = {'rms_norm': f}\n", "OVERRIDES = {'rms_norm': g}\n"
    pa = plan_mod.kernel_path(a, ("rms_norm",))
    assert pa == plan_mod.kernel_path(a, ("rms_norm",)) != plan_mod.kernel_path(b, ("rms_norm",))
    assert pa.startswith("kernels/rms_norm_") and pa.endswith(".py") and len(pa) == len("kernels/rms_norm_.py") + 12
    odd = plan_mod.kernel_path(a, ("a/b c", "x" * 200))
    assert re.fullmatch(r"kernels/[a-z0-9_]{1,40}_[0-9a-f]{12}\.py", odd)
    assert plan_mod.kernel_path(a).startswith("kernels/config_")          # a config candidate overrides no op
    assert plan_mod.kernel_path("") != "kernels/" + plan_mod.COMPOSED_KERNEL


def test_a_recompile_keeps_a_seeds_name_and_records_its_parent():
    """Each recompile judges the parent's optimizations again under ``seed:<name>``; the accepted one
    keeps ``<name>`` (the parent field holds the lineage), so three recompiles leave it as it was."""
    from compiler.search.acceptance import name_of
    source = "OVERRIDES = {'rms_norm': f}\n"
    name = name_of(source, "offline-kernel-0", 16)
    assert name == "offline-kernel-0-rms_norm-16"
    for _ in range(3):
        author = plan_mod.seed_author(name)
        assert plan_mod.seed_parent(author) == name
        name = name_of(source, author, 1)
    assert name == "offline-kernel-0-rms_norm-16"
    assert plan_mod.seed_parent("offline-kernel-0") == ""
    opt = plan_mod.PlanOptimization(name=name, targets=("rms_norm",), speedup={"fast": 1.1, "slow": 1.0}, parent=name)
    assert plan_mod.PlanOptimization.from_dict(opt.to_dict()) == opt
    assert plan_mod.PlanOptimization.from_dict({k: v for k, v in opt.to_dict().items() if k != "parent"}).parent == ""


def test_software_versions_name_tkcc_also_when_run_from_an_uninstalled_tree(monkeypatch):
    import tomllib
    from pathlib import Path

    import persistent_engine.versions as pv
    from compiler.search import inputs
    declared = tomllib.loads((Path(inputs.__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]["version"]
    monkeypatch.setattr(pv, "package_version", lambda name: None)
    assert inputs.software_versions()["tkcc"] == f"{declared}+source"
