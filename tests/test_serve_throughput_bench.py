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
    from compiler import plan as plan_mod

    opt = plan_mod.Optimization(name="silu", targets=("silu_and_mul",), speedup={"fast": 1.0, "slow": 1.0},
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
                       "--variants", "plan,reference", "--requests", "4", "--rates", "2,8", "--max-input", "16",
                       "--max-output", "4", "--graph-sizes", "", "--max-model-len", "128", "--out", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert [v["variant"] for v in doc["variants"]] == ["plan", "reference"]
    plan, ref = doc["variants"]
    assert plan["overrides"] == ["silu_and_mul"] and plan["engine"]["max_num_seqs"] == 4 and plan["plan"]
    assert ref["overrides"] == [] and ref["engine"]["max_num_seqs"] == 128
    for v in doc["variants"]:
        assert [r["rate"] for r in v["runs"]] == [2.0, 8.0]
        for r in v["runs"]:
            assert r["completed"] == 4 and r["output_tokens_per_s"] > 0 and r["predicted"]["tpot_ms"]["p50"] > 0
    assert doc["software"]["torch"] and "triton" in doc["software"]
