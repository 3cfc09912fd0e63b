"""A sample plan record shared by the plan, report and apply tests."""

from compiler.plan import artifact as plan_mod
from persistent_engine.io_struct import WorkloadPoint


def make_plan(**changes) -> plan_mod.Plan:
    opt = plan_mod.PlanOptimization(
        name="offline-0-rms_norm-1", targets=("rms_norm",), speedup={"fast": 1.31, "slow": 1.12},
        per_point=(plan_mod.PointSpeedup(WorkloadPoint("decode", 8, 512, 1, 0.7), fast=1.4, slow=1.1),),
        kernel="kernels/offline_0_rms_norm_1.py", author="offline-0", description="fused rms", noise=0.02)
    base = dict(
        model="tiny-dense", hw="h200", detected_device={"kind": "cpu", "name": "x86_64", "matches_hw": False},
        software={"python": "3.11", "torch": "2.13"},
        traffic={"source": "conv.csv", "hash": "abc123", "summary": {"rows": 10}},
        workload_points=(WorkloadPoint(phase="decode", batch=8, context=512, chunk=1, weight=0.7),
                         WorkloadPoint(phase="prefill", batch=1, context=0, chunk=256, weight=0.3)),
        optimizations=(opt,),
        plan_speedup={"fast": 1.3, "slow": 1.1, "per_point": [
            {"phase": "decode", "batch": 8, "context": 512, "chunk": 1, "weight": 0.7, "fast": 1.4, "slow": 1.1},
            {"phase": "prefill", "batch": 1, "context": 0, "chunk": 256, "weight": 0.3, "fast": 1.1, "slow": 1.05}]},
        parallelism={"configs": [
            {"tp": 1, "pp": 1, "ep": 1, "dp": 1, "dcp": 1, "dtype": "bf16", "fits": True,
             "tokens_per_s_per_gpu": 900.0, "tokens_per_s_per_user": 80.0, "pareto": True},
            {"tp": 2, "pp": 1, "ep": 1, "dp": 1, "dcp": 1, "dtype": "bf16", "fits": True,
             "tokens_per_s_per_gpu": 600.0, "tokens_per_s_per_user": 120.0, "pareto": True},
            {"tp": 4, "pp": 1, "ep": 1, "dp": 1, "dcp": 1, "dtype": "bf16", "fits": True,
             "tokens_per_s_per_gpu": 300.0, "tokens_per_s_per_user": 100.0, "pareto": False}],
            "best": {"tp": 1, "pp": 1, "ep": 1, "dp": 1, "dcp": 1, "dtype": "bf16"}},
        projected={"tokens_per_s_per_gpu": 900.0, "label": "projected"},
        tiers={"fast": {"layers": [0]}, "slow": {"layers": [0, 1]}},
        baseline={"op_ms": {"rms_norm": 0.2, "linear": 1.0}, "op_ms_after": {"rms_norm": 0.1, "linear": 1.0}},
        run={"budget_s": 60, "elapsed_s": 70, "tried": 5, "restarts": 1})
    base.update(changes)
    return plan_mod.Plan(**base)
