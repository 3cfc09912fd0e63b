"""A plan version whose one optimization is a template's rendered candidate, unsearched: a kernel's end-to-end
time without a search, through the same benchmark as a searched plan.

    python3 scripts/plan_from_template.py /tmp/pstep dense_gqa_decode_step.triton_persistent DSTP_BLOCK_N=32
    python3 benchmarks/e2e_decode.py --device cuda --plan /tmp/pstep --cases llama-1b:all@1/1024

Arguments: the plan root, the template, KNOB=VALUE overrides of its defaults. The plan is for llama-1b at batch 1,
context 1024; its speedups say 1.0 (nothing was judged).
"""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agents.templates import Choice, get_template, render_candidate
from compiler.plan import artifact as plan_mod
from compiler.plan.compose import Part, compose
from persistent_engine.io_struct import WorkloadPoint

root, name = Path(sys.argv[1]), sys.argv[2]
knobs = dict(kv.split("=") for kv in sys.argv[3:])
t = get_template(name)
k = {**t.default(), **{a: type(t.default()[a])(b) for a, b in knobs.items()}}
source = render_candidate([Choice(t, k)])
opt = plan_mod.PlanOptimization(name="step", targets=(t.op,), speedup={"fast": 1.0, "slow": 1.0},
                                kernel="kernels/step.py", author="manual", description=f"{name} {k}")
plan = plan_mod.Plan(model="llama-1b", hw="h200", detected_device={"kind": "cuda", "name": "gpu"},
                     software={"torch": "x"}, traffic={"source": "none", "hash": "h", "summary": {}},
                     workload_points=(WorkloadPoint(phase="decode", batch=1, context=1024, chunk=1, weight=1.0),),
                     optimizations=(opt,), plan_speedup={"fast": 1.0, "slow": 1.0, "per_point": []},
                     tiers={"fast": {"layers": [0]}, "slow": {"layers": list(range(16))}})
print(plan_mod.write_version(root, plan, sources={"kernels/step.py": source},
                             composed_source=compose([Part("step", source, (t.op,), ())]), profile=None))
