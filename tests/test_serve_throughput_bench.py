"""benchmarks/serve_throughput.py's logic on CPU: tiny-dense, a plan variant and the reference, a few
requests at two rates, through the real server; the JSON it writes."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

KERNEL = """
import torch

def silu_and_mul(x):
    gate, up = x.float().chunk(2, dim=-1)
    return (gate * torch.sigmoid(gate) * up).to(x.dtype)

OVERRIDES = {"silu_and_mul": silu_and_mul}
CONFIG = {"max_num_seqs": 4, "max_num_batched_tokens": 32}
"""


def _tiny_plan(root: Path) -> Path:
    from compiler.plan import artifact as plan_mod

    opt = plan_mod.PlanOptimization(name="silu", targets=("silu_and_mul",), speedup={"fast": 1.0, "slow": 1.0},
                                kernel="kernels/silu.py")
    plan = plan_mod.Plan(model="tiny-dense", hw="cpu", detected_device={"kind": "cpu"}, software={},
                         traffic={"source": "test", "hash": "x", "summary": {}}, workload_points=(),
                         optimizations=(opt,), plan_speedup={"fast": 1.0, "slow": 1.0})
    return plan_mod.write_version(root, plan, sources={"kernels/silu.py": KERNEL}, composed_source=KERNEL, profile=None)


def _load():
    spec = importlib.util.spec_from_file_location("serve_throughput", ROOT / "benchmarks/serve_throughput.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_serve_throughput_cpu(tmp_path):
    _tiny_plan(tmp_path / "plan")
    out = tmp_path / "serve.json"
    rc = _load().main(["--device", "cpu", "--model", "tiny-dense", "--plan", str(tmp_path / "plan"),
                       "--variants", "plan,reference", "--requests", "4", "--warmup-requests", "2", "--rates", "2,8", "--max-input", "16",
                       "--max-output", "4", "--graph-sizes", "", "--max-model-len", "128", "--out", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["complete"] is True and not out.with_name(out.name + ".tmp").exists()
    assert [v["variant"] for v in doc["variants"]] == ["plan", "reference"]
    plan, ref = doc["variants"]
    assert plan["overrides"] == ["silu_and_mul"] and plan["engine"]["max_num_seqs"] == 4 and plan["plan"]
    assert ref["overrides"] == [] and ref["engine"]["max_num_seqs"] == 128
    for v in doc["variants"]:
        assert v["warmup_s"] >= 0 and v["load_s"] > 0 and v["compiles"] == 0 and v["warmup_replay_s"] > 0
        assert [r["rate"] for r in v["runs"]] == [2.0, 8.0]
        for r in v["runs"]:
            assert r["completed"] == 4 and r["output_tokens_per_s"] > 0 and r["predicted"]["tpot_ms"]["p50"] > 0
            assert r["predicted"]["step_time"]["p"] > 0 and r["wall_s"] > 0
    assert doc["software"]["torch"] and "triton" in doc["software"]


def test_each_finished_variant_is_written_before_the_next_starts(tmp_path, monkeypatch, capsys):
    """A variant that dies (a timeout, a compile error) leaves the variants and runs before it on disk."""
    mod = _load()
    out = tmp_path / "serve.json"
    calls = []

    def fake_variant(name, args, plan, on_run):       # the server part is covered by the slow test above
        calls.append(name)
        if name == "torch_compile":
            assert json.loads(out.read_text())["variants"] == [{"variant": "reference", "runs": [{"rate": 1.0}, {"rate": 4.0}]}]
            on_run({"variant": name, "runs": [{"rate": 1.0}]})
            raise KeyboardInterrupt                   # killed in its second rate
        v = {"variant": name, "runs": []}
        for rate in args.rates:
            v["runs"].append({"rate": rate})
            on_run(v)
        return v

    monkeypatch.setattr(mod, "run_variant", fake_variant)
    with pytest.raises(KeyboardInterrupt):
        mod.main(["--device", "cpu", "--plan", "", "--variants", "reference,torch_compile", "--rates", "1,4",
                  "--out", str(out)])
    doc = json.loads(out.read_text())
    assert calls == ["reference", "torch_compile"] and doc["complete"] is False
    assert [(v["variant"], [r["rate"] for r in v["runs"]]) for v in doc["variants"]] == \
        [("reference", [1.0, 4.0]), ("torch_compile", [1.0])]
    assert doc["variants_requested"] == ["reference", "torch_compile"] and doc["requests_per_run"] == 40


def test_bad_arguments_exit_2(tmp_path, capsys):
    mod = _load()
    assert mod.main(["--device", "cpu", "--variants", "plan,fast", "--out", str(tmp_path / "x.json")]) == 2
    assert mod.main(["--device", "cpu", "--rates", "1,x", "--out", str(tmp_path / "x.json")]) == 2
    assert not (tmp_path / "x.json").exists()


def test_a_failing_variant_is_recorded_and_the_next_still_runs(tmp_path, monkeypatch, capsys):
    mod = _load()
    out = tmp_path / "serve.json"

    def fake_variant(name, args, plan, on_run):
        if name == "torch_compile":
            on_run({"variant": name, "runs": [{"rate": 1.0}]})
            raise RuntimeError("tkcc bench serve exited 2 at 4.0x")
        return {"variant": name, "runs": [{"rate": r} for r in args.rates]}

    monkeypatch.setattr(mod, "run_variant", fake_variant)
    assert mod.main(["--device", "cpu", "--plan", "", "--variants", "torch_compile,reference", "--rates", "1,4",
                     "--out", str(out)]) == 1
    doc = json.loads(out.read_text())
    assert doc["complete"] is False
    comp, ref = doc["variants"]
    assert comp["runs"] == [{"rate": 1.0}] and "exited 2" in comp["error"]
    assert ref == {"variant": "reference", "runs": [{"rate": 1.0}, {"rate": 4.0}]}


def test_every_variant_captures_the_reference_graph_sizes():
    """torch_compile is not handed coarser graph sizes than the reference (padding a batch of 3 to 16
    made its decode pay for 13 rows it does not serve); only it compiles."""
    mod = _load()
    args = mod.argparse.Namespace(model="llama-1b", device="cuda", max_model_len=2560, max_num_seqs=128,
                                  graph_sizes=(1, 2, 4, 8, 16, 32, 64, 128), kv_cache_gib=0.5,
                                  spot_check=0.02, mixed_batches=True)
    opts = {v: mod.variant_options(v, args, None) for v in ("reference", "torch_compile", "plan")}
    assert opts["reference"].graph_sizes == opts["torch_compile"].graph_sizes == args.graph_sizes
    assert opts["torch_compile"].graphs and opts["torch_compile"].compile and not opts["reference"].compile
    assert opts["plan"].mixed_batches is True and opts["reference"].mixed_batches is None   # the plan's flag
    assert opts["reference"].kv_cache_bytes == opts["torch_compile"].kv_cache_bytes == 1 << 29
    plan = mod.variant_options("plan", args, "plans/x")
    assert plan.graph_sizes == args.graph_sizes and plan.model is None and not plan.compile
