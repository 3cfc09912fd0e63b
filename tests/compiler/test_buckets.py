"""Per-bucket plan variants (compiler/plan/buckets.py): where a plan's member loses at some decode batch sizes, the
search measures the set without it and keeps it for those sizes; the plan records it with its own verified file;
loading refuses a variant that overrides more than its members; serving runs the variant's kernels at the batch
sizes it holds and the plan's elsewhere."""

import dataclasses
import json

import pytest
import torch

from compiler.plan import apply
from compiler.plan import artifact as plan_mod
from compiler.plan.buckets import UNBOUNDED, BucketVariant, check_disjoint, losing_runs, spans, variant_for
from compiler.plan.compose import Part, compose
from compiler.search.acceptance import Accepted, Acceptor, Composition, merge_points
from persistent_engine.io_struct import PointTiming, WorkloadPoint
from persistent_engine.supervisor import CandidateVerdict
from plan_samples import make_plan

POINTS = [WorkloadPoint("decode", b, 256, 1, 0.25) for b in (1, 16, 64)] + \
         [WorkloadPoint("prefill", 1, 0, 64, 0.25)]


def _speedups(table: dict[int, float]) -> dict:
    return {p.key: table.get(p.batch, 1.0) if p.phase == "decode" else 1.1 for p in POINTS}


def test_losing_runs_group_consecutive_batches_and_spans_split_between_points():
    per = {"gemv": _speedups({1: 1.4, 16: 0.5, 64: 0.6}), "norm": _speedups({1: 1.2, 16: 1.1, 64: 0.9})}
    runs = losing_runs(POINTS, per)
    assert runs == [(16, 16, frozenset({"gemv"})), (64, 64, frozenset({"gemv", "norm"}))]
    assert spans(runs, [1, 16, 64]) == [(9, 39, frozenset({"gemv"})), (40, UNBOUNDED, frozenset({"gemv", "norm"}))]
    assert losing_runs(POINTS, {"gemv": _speedups({1: 1.4, 16: None})}) == []       # not timed: not losing
    v = [BucketVariant(9, 39, ("a",), "kernels/bucket_b9-39.py"), BucketVariant(40, UNBOUNDED, (), "kernels/x.py")]
    assert variant_for(8, v) is None and variant_for(9, v) is v[0] and variant_for(500, v) is v[1]
    check_disjoint(v, "p")
    with pytest.raises(plan_mod.PlanError, match="overlap at 39"):
        check_disjoint([v[0], BucketVariant(39, 50, (), "kernels/y.py")], "p")
    with pytest.raises(plan_mod.PlanError, match="needs batches"):
        BucketVariant.from_dict({"batches": [1], "members": [], "kernel": "kernels/z.py"}, "p")
    with pytest.raises(plan_mod.PlanError, match="invalid"):
        BucketVariant.from_dict({"batches": [4, 2], "members": [], "kernel": "kernels/z.py"}, "p")


def cand(op: str) -> str:
    return f'import torch\n\n\ndef f(*a):\n    return a[0]\n\n\nOVERRIDES = {{"{op}": f}}\n'


FACTOR = {"linear": {1: 1.5, 16: 0.5, 64: 0.5}, "rms_norm": {1: 1.2, 16: 1.2, 64: 1.2}}


def table_engine(calls: list):
    """A verdict per composed source: at each decode point the product of its ops' factors (FACTOR)."""
    def evaluate(tier, source):
        ops = {op for op in FACTOR if f"'{op}'" in source or f'"{op}"' in source}
        calls.append((tier, tuple(sorted(ops))))
        per = []
        for p in POINTS:
            s = 1.0
            for op in ops:
                s *= FACTOR[op].get(p.batch, 1.0) if p.phase == "decode" else 1.1
            per.append(PointTiming(p, p.label(), True, 1.0, 1.0, s))
        mean = sum(t.speedup for t in per) / len(per)
        return CandidateVerdict(correct=True, reasons=[], speedup=mean, per_point=per)
    return evaluate


def accepted(op: str, evaluate) -> Accepted:
    v = evaluate("slow", cand(op))
    return Accepted(op, cand(op), "offline-0", (op,), (), v.speedup, v.speedup, merge_points(POINTS, v, v), 0.01)


def test_bucket_variants_keep_the_set_without_the_losing_member_where_it_wins():
    calls: list = []
    evaluate = table_engine(calls)
    acc = Acceptor(evaluate, POINTS, {"fast": 0.01, "slow": 0.01})
    parts = (accepted("linear", evaluate), accepted("rms_norm", evaluate))
    src = compose([Part(a.name, a.source, a.targets) for a in parts])
    v = evaluate("slow", src)
    composition = Composition(parts, src, v.speedup, v.speedup, merge_points(POINTS, v, v))
    calls.clear()
    out = acc.bucket_variants(composition)
    assert calls == [("fast", ("rms_norm",)), ("slow", ("rms_norm",))]                 # one set, both tiers
    ((lo, hi, variant),) = out.variants
    assert (lo, hi) == (9, UNBOUNDED) and [a.name for a in variant.parts] == ["rms_norm"]
    assert {pp.point.batch: pp.slow for pp in variant.per_point if pp.point.phase == "decode"} == \
        {1: 1.2, 16: 1.2, 64: 1.2}
    calls.clear()
    assert acc.bucket_variants(composition, deadline=0.0).variants == () and calls == []   # past the deadline


def test_a_variant_without_every_member_is_the_reference_and_needs_no_verdict():
    calls: list = []
    evaluate = table_engine(calls)
    acc = Acceptor(evaluate, POINTS, {"fast": 0.01, "slow": 0.01})
    part = accepted("linear", evaluate)
    composition = Composition((part,), compose([Part(part.name, part.source, part.targets)]), part.fast, part.slow,
                              part.per_point)
    calls.clear()
    ((lo, hi, variant),) = acc.bucket_variants(composition).variants
    assert calls == [] and variant.parts == () and "OVERRIDES = {}" in variant.source and lo == 9


# ---------------------------------------------------------------- the plan on disk, loaded and served
COUNTED = '''import torch

CALLS = []


def silu_and_mul(x):
    CALLS.append(x.shape[0])
    d = x.shape[-1] // 2
    return torch.nn.functional.silu(x[..., :d]) * x[..., d:]


OVERRIDES = {"silu_and_mul": silu_and_mul}
'''


def _write(tmp_path, variant_source: str, members: tuple[str, ...] = ()) -> str:
    """A tiny-dense plan whose composed file counts its silu_and_mul calls and one variant for batches 2..4."""
    plan = make_plan(variants=(BucketVariant(2, 4, members, "kernels/bucket_b2-4.py").to_dict(),),
                     optimizations=(dataclass_opt(),))
    plan_mod.write_version(tmp_path / "plan", plan, sources={"kernels/offline_0_rms_norm_1.py": COUNTED,
                                                             "kernels/bucket_b2-4.py": variant_source},
                           composed_source=COUNTED, profile=None)
    return str(tmp_path / "plan")


def dataclass_opt():
    return dataclasses.replace(make_plan().optimizations[0], targets=("silu_and_mul",))


def test_a_plan_with_a_variant_loads_it_and_refuses_one_that_overrides_more_than_its_members(tmp_path):
    root = _write(tmp_path, compose([]))
    loaded = apply.load(root)
    ((variant, overrides),) = loaded.variants
    assert (variant.lo, variant.hi, overrides) == (2, 4, {}) and set(loaded.overrides) == {"silu_and_mul"}
    doc = json.loads((plan_mod.resolve(root) / "plan.json").read_text())
    assert doc["variants"][0]["batches"] == [2, 4] and "kernels/bucket_b2-4.py" in doc["kernel_sha256"]
    other = _write(tmp_path / "b", COUNTED)                     # a variant whose members hold no silu_and_mul
    with pytest.raises(plan_mod.PlanError, match="overrides silu_and_mul, its members verified nothing"):
        apply.load(other)
    stranger = _write(tmp_path / "c", compose([]), members=("not-in-the-plan",))
    with pytest.raises(plan_mod.PlanError, match="does not hold: not-in-the-plan"):
        apply.load(stranger)


@pytest.mark.parametrize("compiled", [False, True])
def test_serving_runs_the_variant_at_the_batch_sizes_it_holds(tmp_path, compiled):
    """Decodes of 1 and 5 sequences run the plan's silu_and_mul, a decode of 3 the variant's (the reference: it
    keeps no member); prefills run the plan's. ``compiled``: the decode forward under dynamo (the CUDA default),
    whose guards must see the variant's overrides, not replay the plan's trace."""
    from compiler.serve.runtime import ServeOptions, build_runtime
    from persistent_engine.serving import SamplingParams

    if compiled:
        torch._dynamo.reset()
    rt = build_runtime(ServeOptions(plan=_write(tmp_path, compose([])), device="cpu", max_model_len=64,
                                    spot_check=0.0, compile=compiled, compile_backend="eager"))
    calls = rt.plan_overrides["silu_and_mul"].__globals__["CALLS"]

    def decode_rows(n: int) -> list[int]:
        calls.clear()
        for i in range(n):
            rt.engine.add(f"{n}-{i}", [1 + i, 2, 3], SamplingParams(max_tokens=2, temperature=0))
        with rt.overrides():
            while rt.engine.has_work():
                rt.engine.step()
        return sorted(set(calls))
    assert decode_rows(1) == [1, 3]             # the prompt (3 tokens) and the 1-row decode: the plan's kernel
    assert decode_rows(3) == [9]                # the 3-row decode: the variant (reference); the prefill's 9 rows
    assert decode_rows(5) == [5, 15]            # 5 rows: past the variant's range, the plan's again
    from compiler.serve.openai_app import ServeServer
    import httpx

    if compiled:
        return
    with ServeServer(rt) as s:
        assert httpx.get(s.url + "/v1/models").json()["data"][0]["variants"] == [{"batches": [2, 4], "overrides": []}]


def test_the_report_names_each_variants_batch_sizes_and_members():
    from compiler.plan import report

    v = BucketVariant(9, UNBOUNDED, ("offline-0-rms_norm-1",), "kernels/bucket_b9-1048576.py",
                      (plan_mod.PointSpeedup(WorkloadPoint("decode", 16, 256, 1, 1.0), 1.3, 1.25),))
    text = report.render(make_plan(variants=(v.to_dict(),)))["report.md"]
    assert "| 9+ | offline-0-rms_norm-1 | 1.250x | [kernels/bucket_b9-1048576.py]" in text
    assert "Variants per decode batch size" not in report.render(make_plan())["report.md"]


def test_plan_apply_checks_each_decode_point_with_the_file_that_serves_it(tmp_path):
    """``check_plan``: the decode point of batch 3 runs the variant (in its own executor when it keeps a member),
    the others the plan's composed file; each within tolerance of the reference."""
    points = (WorkloadPoint("decode", 3, 32, 1, 0.5), WorkloadPoint("decode", 8, 32, 1, 0.5))
    for members, source in (((), compose([])), (("offline-0-rms_norm-1",), COUNTED)):
        root = tmp_path / f"m{len(members)}"
        plan = make_plan(variants=(BucketVariant(2, 4, members, "kernels/bucket_b2-4.py").to_dict(),),
                         optimizations=(dataclass_opt(),), workload_points=points)
        plan_mod.write_version(root, plan, sources={"kernels/offline_0_rms_norm_1.py": COUNTED,
                                                    "kernels/bucket_b2-4.py": source},
                               composed_source=COUNTED, profile=None)
        _, checks = apply.check_plan(root, layers=[0], dtype="fp32", repeats=1)
        assert [c.served_by for c in checks] == ["kernels/bucket_b2-4.py", "kernels/composed.py"]
        assert all(c.ok for c in checks)


def test_a_plan_json_with_a_malformed_variant_is_refused_in_one_line(tmp_path):
    root = _write(tmp_path, compose([]))
    vdir = plan_mod.resolve(root)
    doc = json.loads((vdir / "plan.json").read_text())
    doc["variants"].append({"batches": [3, 9], "members": [], "kernel": "kernels/bucket_b2-4.py"})
    (vdir / "plan.json").write_text(json.dumps(doc))
    with pytest.raises(plan_mod.PlanError, match="variant batch ranges overlap at 3"):
        plan_mod.load(root)
    doc["variants"] = [{"batches": "all"}]
    (vdir / "plan.json").write_text(json.dumps(doc))
    with pytest.raises(plan_mod.PlanError, match="a variant needs batches"):
        plan_mod.load(root)


def test_settings_stay_in_every_variant_through_the_config_acceptor():
    """A member that sets CONFIG knobs (the config search's) is never dropped from a variant: a plan has one
    engine config; the loop's ConfigAcceptor hands the variants to its kernels' acceptor."""
    from compiler.search.config_plan import ConfigAcceptor

    calls: list = []
    evaluate = table_engine(calls)
    inner = Acceptor(evaluate, POINTS, {"fast": 0.01, "slow": 0.01})
    setting = 'CONFIG = {"max_num_seqs": 32}\n'
    cfg = Accepted("cfg", setting, "config", (), ("max_num_seqs",), 1.0, 1.0,
                   tuple(plan_mod.PointSpeedup(p, 0.5, 0.5) for p in POINTS), 0.01)      # "slower": a setting
    parts = (accepted("linear", evaluate), cfg)
    src = compose([Part(a.name, a.source, a.targets, a.config_keys) for a in parts])
    v = evaluate("slow", src)
    composition = Composition(parts, src, v.speedup, v.speedup, merge_points(POINTS, v, v))
    ((lo, _, variant),) = ConfigAcceptor(inner, judge=None).bucket_variants(composition).variants
    assert lo == 9 and [a.name for a in variant.parts] == ["cfg"] and "max_num_seqs" in variant.source


def test_vllm_export_names_each_variant_it_cannot_carry():
    from compiler.export.vllm_package import classify
    from persistent_engine.models.spec import ModelSpec

    plan = make_plan(variants=(BucketVariant(2, 4, (), "kernels/bucket_b2-4.py").to_dict(),))
    _, skipped, _ = classify(plan, {}, ModelSpec.from_name("tiny-dense"))
    assert {"op": "the variant for decode batches 2-4", "optimization": None, "kernel": "kernels/bucket_b2-4.py",
            "reason": "a vLLM CustomOp runs one kernel at every batch size: the plan's kernels serve these sizes "
                      "too"} in skipped


PDL_KERNEL = 'import torch\n\nGEMV_PDL = 0\n\n\ndef f(*a):\n    return a[0]\n\n\nOVERRIDES = {"linear": f}\n'


@pytest.mark.parametrize("gain,kept", [(1.10, True), (1.005, False)])
def test_plan_wide_pdl_replaces_the_composed_source_only_when_faster_beyond_the_noise(gain, kept):
    """The composition tries PDL in every template kernel at once (``with_pdl``: each ``*_PDL = 0`` set to 1) and
    keeps it only when the slow tier measures it faster than the composition beyond the noise; its bucket
    variants are composed with PDL on too."""
    from compiler.plan.compose import with_pdl

    calls: list = []
    base = table_engine(calls)

    def evaluate(tier, source):
        v = base(tier, source)
        if "GEMV_PDL = 1" not in source:
            return v
        per = [PointTiming(t.point, t.label, True, 1.0, 1.0, t.speedup * gain) for t in v.per_point]
        return CandidateVerdict(correct=True, reasons=[], speedup=v.speedup * gain, per_point=per)

    acc = Acceptor(evaluate, POINTS, {"fast": 0.01, "slow": 0.01})
    parts = (accepted("linear", evaluate),)
    parts = (dataclasses.replace(parts[0], source=PDL_KERNEL), accepted("rms_norm", evaluate))
    src = compose([Part(a.name, a.source, a.targets) for a in parts])
    assert with_pdl(src).count("GEMV_PDL = 1") == 1 and with_pdl(cand("rms_norm")) is None
    v = evaluate("slow", src)
    composition = Composition(parts, src, v.speedup, v.speedup, merge_points(POINTS, v, v))
    out = acc.plan_wide_pdl(composition)
    assert out.pdl is kept and ("GEMV_PDL = 1" in out.source) is kept
    assert out.slow == pytest.approx(composition.slow * (gain if kept else 1.0))
    assert "GEMV_PDL = 1" in acc._variant([parts[0]], pdl=True).source                # a variant of a PDL plan


def test_the_plan_record_holds_the_compositions_variants_and_pdl():
    """``writer.build_plan``: each (lo, hi, set) of the composition becomes a plan.json variant naming its members
    and its file; a PDL composition says so in plan_speedup."""
    from types import SimpleNamespace as NS

    from compiler.plan.writer import build_plan

    calls: list = []
    evaluate = table_engine(calls)
    parts = (accepted("linear", evaluate), accepted("rms_norm", evaluate))
    acc = Acceptor(evaluate, POINTS, {"fast": 0.01, "slow": 0.01})
    src = compose([Part(a.name, a.source, a.targets) for a in parts])
    v = evaluate("slow", src)
    composition = acc.bucket_variants(dataclasses.replace(
        Composition(parts, src, v.speedup, v.speedup, merge_points(POINTS, v, v)), pdl=True))
    cfg = NS(model="tiny-dense", hw="h200", budget_s=60, wall_s=None, agents="offline:1", fleet="local",
             tpot_ms=None, ttft_ms=None, drift=None, parent_version=None, out="x")
    run_in = NS(device={"kind": "cpu"}, fast_layers=[0], slow_layers=[0, 1], layout=None, layout_note="",
                points=POINTS, projected=None, traffic=NS(source="t.csv", hash="h", summary={}))
    outcome = NS(composition=composition, baseline=NS(op_ms={}, noise={}, profile={}), interrupted=False,
                 torch_compile=None, tier_info={}, tried=2, accepted=list(parts), restarts=0, tally=None)
    plan = build_plan(cfg, run_in, outcome, {}, 1.0, {})
    assert plan.variants == ({"batches": [9, UNBOUNDED], "members": ["rms_norm"], "kernel": "kernels/bucket_b9-1048576.py",
                              "per_point": [p.to_dict() for p in composition.variants[0][2].per_point]},)
    assert "plan-wide" in plan.plan_speedup["pdl"]
    assert plan_mod.Plan.from_dict(json.loads(json.dumps(plan.to_dict()))).bucket_variants()[0].members == ("rms_norm",)
