"""benchmarks/e2e_decode.py on CPU: a plan written in the compiler's format (plan.json, one candidate
in kernels/, the composed file) is loaded, its overrides and step CONFIG run the tiny-dense model, the
agreement check passes for a correct override and fails for a wrong one, and the JSON has the fields
issue 10 asks for. torch.compile is skipped (--no-compile): on 2 CPU cores it takes ~30 s per case."""

import dataclasses
import importlib.util
import json
import sys
from argparse import Namespace
from pathlib import Path

import pytest
import torch

from compiler.plan import artifact as plan_mod
from compiler.plan.compose import Part, compose
from persistent_engine.executor.compiled_step import baseline_words
from persistent_engine.io_struct import WorkloadPoint
from persistent_engine.models.decoder import build_model
from persistent_engine.models.spec import ModelSpec
from persistent_engine.inputs.workloads import make_workload
from test_baseline_gptfast_bench import tiny_qwen3_moe

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "e2e_decode.py"
CORRECT = '''"""fused_add_rms_norm in fp32, one fused expression."""
import torch


def fused_add_rms_norm(x, residual, weight, eps):
    r = x.float() + residual.float()
    return (r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype), r.to(x.dtype)


OVERRIDES = {"fused_add_rms_norm": fused_add_rms_norm}
CONFIG = {"kv_block_size": 8, "max_num_seqs": 64}
'''
WRONG = '''import torch


def fused_add_rms_norm(x, residual, weight, eps):
    return x * weight, x + residual


OVERRIDES = {"fused_add_rms_norm": fused_add_rms_norm}
'''


def _bench():
    spec = importlib.util.spec_from_file_location("e2e_decode_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


bench = _bench()
variants = sys.modules["benchmarks.e2e_variants"]     # imported by the script: its timing of each variant


def write_plan(root: Path, name: str, source: str, model: str = "tiny-dense",
               ops: tuple = ("fused_add_rms_norm",)) -> Path:
    """A plan version directory as ``tkcc optimize`` writes it (compiler.plan.artifact.write_version)."""
    knobs = tuple(k for k in ("kv_block_size", "max_num_seqs") if k in source)
    opt = plan_mod.PlanOptimization(name=name, targets=ops, speedup={"fast": 1.2, "slow": 1.1},
                                kernel=f"kernels/{name}.py", author="test", description=f"{ops[0]} override")
    plan = plan_mod.Plan(
        model=model, hw="cpu", detected_device={"kind": "cpu", "name": "x86_64"},
        software={"torch": "x"}, traffic={"source": "t", "hash": "h", "summary": {}},
        workload_points=(WorkloadPoint(phase="decode", batch=2, context=24, chunk=1, weight=1.0),),
        optimizations=(opt,), plan_speedup={"fast": 1.2, "slow": 1.1, "per_point": []},
        tiers={"fast": {"layers": [0]}, "slow": {"layers": [0, 1]}})
    return plan_mod.write_version(root, plan, sources={f"kernels/{name}.py": source},
                                  composed_source=compose([Part(name, source, ops, knobs)]), profile=None)


def run(tmp_path, *args: str) -> tuple[int, dict | None]:
    out = tmp_path / "result.json"
    rc = bench.main(["--device", "cpu", "--no-compile", "--samples", "2", "--eager-samples", "2", "--steps", "2",
                     "--out", str(out), *args])
    return rc, (json.loads(out.read_text()) if out.exists() else None)


def test_plan_overrides_and_config_agree_with_the_reference(tmp_path):
    vdir = write_plan(tmp_path / "plan", "rms-fp32", CORRECT)
    md = tmp_path / "perf.md"
    rc, doc = run(tmp_path, "--plan", str(vdir.parent), "--cases", "tiny-dense:all@1,2/24", "--ablate",
                  "--markdown", str(md))
    assert rc == 0
    assert {"gpu", "driver", "torch", "triton", "date", "cases", "timer"} <= set(doc)
    assert doc["timer"]["steps"] == 2 and doc["timer"]["samples"] == 2 and "FairTimer" in doc["timer"]["rule"]
    assert [(c["model"], c["batch"], c["context"]) for c in doc["cases"]] == [("tiny-dense", 1, 24),
                                                                           ("tiny-dense", 2, 24)]
    for c in doc["cases"]:
        assert c["reference_ms"] > 0 and c["tkcc_ms"] > 0 and c["floor_ms"] > 0
        assert c["torch_compile_ms"] is None and c["reference_graph_ms"] is None      # CPU, --no-compile
        assert c["tkcc_source"].startswith("plan overrides") and c["overrides"] == ["fused_add_rms_norm"]
        # kv_block_size 8 (default 16): the context was re-laid out, and still agrees
        assert c["config_applied"] == {"kv_block_size": 8} and c["config_ignored"] == ["max_num_seqs"]
        assert c["agree"] and c["agreement"]["tkcc"]["ok"]
        assert c["agreement"]["tkcc"]["tokens_equal"] == c["batch"]
        assert c["bytes_read"]["kv"] > 0 and c["bytes_read"]["total"] > c["bytes_read"]["weights"]
        assert c["ratios"]["vs_reference"] == pytest.approx(c["reference_ms"] / c["tkcc_ms"])
        # both timings of every variant that ran (CPU, --no-compile: the eager ones), no dispatch or busy on CPU
        assert set(c["timings"]) == {"reference", "gptfast", "tkcc"}
        for name, t in c["timings"].items():
            assert c[f"{name}_ms"] == t["back_to_back_ms"] > 0 and t["one_replay_ms"] > 0
            assert len(t["back_to_back_runs_ms"]) == 3 and t["one_replay_samples"] == 2 and t["steps"] == 2
            assert t["dispatch_ms"] is None and t["busy_ms"] is None and t["held"] is False
        assert c["timings"]["tkcc"]["timed"] == "eager" and c["timings"]["reference"]["timed"] == "eager"
        one = {k: c["timings"][k]["one_replay_ms"] for k in ("reference", "tkcc")}
        assert c["ratios_one_replay"]["vs_reference"] == pytest.approx(one["reference"] / one["tkcc"])
        assert c["ratios"]["vs_gptfast_max_autotune"] is None and c["gptfast_max_autotune_ms"] is None
        assert c["gptfast_max_autotune_note"] == "not measured: --no-compile"
        [ab] = c["ablation"]
        assert ab["name"] == "rms-fp32" and ab["ops"] == ["fused_add_rms_norm"]
        assert ab["config"] == ["kv_block_size", "max_num_seqs"]
        assert ab["without_ms"] > 0 and ab["agree"]
    text = md.read_text()
    assert text.count("| variant | back to back (ms) | one replay (ms) |") == 2 and "| tkcc plan | " in text
    assert text.count("### tiny-dense") == 2 and "| rms-fp32 | fused_add_rms_norm | kv_block_size, max_num_seqs |" in text


def test_a_checkpoint_directory_case_runs_its_own_weights(tmp_path):
    """Issue 46: a case naming an HF checkpoint (config.json beside safetensors) builds its reference from the
    checkpoint's weights, and the row says which weights ran."""
    import shutil

    from persistent_engine.models.spec import ALIASES, CONFIG_DIR
    from persistent_engine.models.weights import save_weights

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    shutil.copy(CONFIG_DIR / ALIASES["tiny-dense"], ckpt / "config.json")
    saved = build_model("tiny-dense", dtype=torch.float32, seed=7)
    save_weights(saved, ckpt / "model.safetensors")
    (case,) = bench.parse_cases([f"{ckpt}:all@1/8"], 8, Path("unused"), "h200", 1)
    model, weights = bench.case_model(case, "cpu", torch.float32, seed=0)
    assert weights == str(ckpt) and all(torch.equal(model.params[k], v) for k, v in saved.params.items())
    model, weights = bench.case_model(bench.parse_cases(["tiny-dense:all@1/8"], 8, Path("unused"), "h200", 1)[0],
                                    "cpu", torch.float32, seed=0)
    assert weights is None and not torch.equal(model.params["embed"], saved.params["embed"])


def test_a_wrong_override_fails_the_agreement_check(tmp_path, capsys):
    vdir = write_plan(tmp_path / "plan", "rms-wrong", WRONG)
    rc, doc = run(tmp_path, "--plan", str(vdir), "--cases", "tiny-dense:all@2/16")
    assert rc == 1 and "disagree" in capsys.readouterr().err
    [c] = doc["cases"]
    assert not c["agree"] and not c["agreement"]["tkcc"]["ok"]
    assert c["agreement"]["tkcc"]["rel_err"] > c["agreement"]["tkcc"]["rel_tol"]


def test_without_a_plan_tkcc_is_the_reference_and_says_so(tmp_path):
    rc, doc = run(tmp_path, "--cases", "tiny-moe:cover@3/16")
    assert rc == 0
    [c] = doc["cases"]
    assert c["layers"] == [0, 1] and "no plan" in c["tkcc_source"] and c["overrides"] == []
    assert c["agreement"]["tkcc"]["rel_err"] == 0.0
    rc, doc = run(tmp_path, "--cases", "tiny-dense@1/8", "--merge")       # a second, split run
    assert rc == 0 and [(c["model"], c["batch"]) for c in doc["cases"]] == [("tiny-moe", 3), ("tiny-dense", 1)]


def test_results_of_separate_runs_merge_into_one_file(tmp_path, capsys):
    """--merge-from: files from runs made apart, a later file's case winning; nothing measured."""
    a, b, out = tmp_path / "a", tmp_path / "b", tmp_path / "merged.json"
    a.mkdir()
    b.mkdir()
    assert run(a, "--cases", "tiny-dense@1,2/8")[0] == 0
    assert run(b, "--cases", "tiny-dense@2/8", "tiny-moe:cover@3/8")[0] == 0
    first, second = (json.loads((d / "result.json").read_text()) for d in (a, b))
    assert bench.main(["--merge-from", str(a / "result.json"), str(b / "result.json"), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [(c["model"], c["batch"]) for c in doc["cases"]] == [("tiny-dense", 1), ("tiny-dense", 2), ("tiny-moe", 3)]
    assert doc["cases"][0] == first["cases"][0] and doc["cases"][1:] == second["cases"]   # b's batch 2 won
    assert [m["date"] for m in doc["merged_from"]] == [first["date"], second["date"]]
    assert "wrote" in capsys.readouterr().out
    (tmp_path / "bad.json").write_text("{not json")
    assert bench.main(["--merge-from", str(tmp_path / "bad.json"), "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("e2e_decode: error:") and "not a readable results file" in err and err.count("\n") == 1
    assert not (tmp_path / "x.json").exists()


def test_user_errors_are_one_line_exit_2_and_write_nothing(tmp_path, capsys):
    rc, doc = run(tmp_path, "--plan", str(tmp_path / "missing"), "--cases", "tiny-dense@1/8")
    err = capsys.readouterr().err
    assert rc == 2 and doc is None and err.startswith("e2e_decode: error: no plan at") and err.count("\n") == 1
    rc, doc = run(tmp_path, "--cases", "tiny-dense@x/8")
    assert rc == 2 and doc is None and "bad case 'tiny-dense@x/8'" in capsys.readouterr().err
    vdir = write_plan(tmp_path / "plan", "rms-fp32", CORRECT)
    rc, doc = run(tmp_path, "--plan", str(vdir), "--cases", "tiny-moe@1/8")
    assert rc == 2 and doc is None and "match no case" in capsys.readouterr().err


# linear as the reference, except the router's logits (tiny-moe: 8 experts) moved by AMP x their RMS
ROUTER_NUDGE = '''import torch
import torch.nn.functional as F
def linear(x, weight, bias):
    out = F.linear(x, weight, bias)
    if out.shape[-1] == 8:
        o = out.float()
        rms = o.pow(2).mean(-1, keepdim=True).sqrt()
        wobble = torch.cos(torch.arange(8, dtype=torch.float32) * 2.3)
        out = (o + wobble * (AMP * rms)).to(out.dtype)
    return out
OVERRIDES = {"linear": linear}
'''


def test_moe_slices_are_also_checked_with_routing_replay():
    """replay_agreement: the engine's rule on an MoE slice — a nudge within the tie band agrees, a clear
    misroute does not (by name), a dense slice has no routing to check."""
    from compiler.plan.apply import overrides_of
    from persistent_engine.models.decoder import build_model

    torch.manual_seed(0)
    model = build_model(ModelSpec.from_name("tiny-moe"), device="cpu", dtype=torch.bfloat16, seed=0)
    wl = make_workload(model, WorkloadPoint(phase="decode", batch=64, context=16), 0)
    ref = model.step(wl).clone()
    ok = bench.replay_agreement(model, wl, overrides_of(ROUTER_NUDGE.replace("AMP", "2e-2")), ref, torch.bfloat16)
    assert ok["ok"] and ok["replayed"] and ok["reason"] is None and ok["rel_err"] < 0.05, ok
    assert "1 tokens flipped at near-ties" in ok["summary"] and "; 0 of 64 sequences left out" in ok["summary"]
    bad = bench.replay_agreement(model, wl, overrides_of(ROUTER_NUDGE.replace("AMP", "0.5")), ref, torch.bfloat16)
    assert not bad["ok"] and "MoE routing differs beyond ties" in bad["reason"], bad
    dense = build_model(ModelSpec.from_name("tiny-dense"), device="cpu", dtype=torch.bfloat16, seed=0)
    dwl = make_workload(dense, WorkloadPoint(phase="decode", batch=2, context=16), 0)
    assert bench.replay_agreement(dense, dwl, {}, dense.step(dwl), torch.bfloat16) is None


def test_an_moe_plan_is_reported_with_its_routing_replay_verdict(tmp_path):
    vdir = write_plan(tmp_path / "plan", "router-nudge", ROUTER_NUDGE.replace("AMP", "2e-2"), "tiny-moe", ("linear",))
    rc, doc = run(tmp_path, "--plan", str(vdir), "--cases", "tiny-moe:cover@64/16")
    [c] = doc["cases"]
    tk = c["agreement"]["tkcc"]
    assert tk["routing_replay"]["replayed"] and tk["routing_replay"]["ok"], tk
    assert tk["ok"] == (tk["ok_plain"] or tk["routing_replay"]["ok"]) and c["agree"] and rc == 0


def test_the_independent_baseline_is_timed_checked_and_every_ratio_given_against_it(tmp_path):
    """The CPU run of issue 22's item: gptfast_ms (eager under --no-compile), its agreement with the reference,
    tkcc / gpt-fast, and the kernels-per-step fields None with the reason."""
    rc, doc = run(tmp_path, "--cases", "tiny-dense:all@1/64")
    assert rc == 0
    [c] = doc["cases"]
    assert c["gptfast_ms"] > 0 and c["gptfast_timed"] == "eager (--no-compile)" and c["gptfast_note"] is None
    assert c["gptfast_compile_s"] is None
    g = c["agreement"]["gptfast"]
    assert g["ok"] and 0 < g["rel_err"] <= g["rel_tol"] == 5e-2 and g["tokens_equal"] == 1   # bf16: not bit-equal
    assert c["ratios"]["vs_gptfast"] == pytest.approx(c["gptfast_ms"] / c["tkcc_ms"])
    assert c["pct_floor"]["gptfast_ms"] == pytest.approx(100 * c["floor_ms"] / c["gptfast_ms"])
    assert c["step_kernels"] is None and "CPU" in c["step_kernels_note"]


def test_a_family_the_baseline_lacks_says_so_and_a_qwen3_moe_config_is_measured(tmp_path, monkeypatch):
    rc, doc = run(tmp_path, "--cases", "tiny-moe:cover@2/16")                  # GLM-4.x: not gpt-fast's
    [c] = doc["cases"]
    assert rc == 0 and c["gptfast_ms"] is None and c["ratios"]["vs_gptfast"] is None
    assert c["gptfast_note"].startswith("not measured:") and "glm4_moe" in c["gptfast_note"]
    assert "gptfast" not in c["agreement"]
    path = tiny_qwen3_moe(tmp_path)                        # a config path may hold "/": the context is /DIGITS
    cases = bench.parse_cases([f"{path}:0,1@1,16/64", f"{path}@2"], 32, bench.DEFAULT_TRAFFIC, "h200", 4)
    assert [(c.model, c.layers, c.batch, c.context) for c in cases] == [
        (str(path), (0, 1), 1, 64), (str(path), (0, 1), 16, 64), (str(path), None, 2, 32)]
    monkeypatch.chdir(tmp_path)                            # qwen3tiny.json in the working directory
    rc, doc = run(tmp_path, "--cases", "qwen3tiny.json:all@3/16", "--dtype", "fp32")
    [c] = doc["cases"]
    assert rc == 0 and c["gptfast_ms"] > 0 and c["agreement"]["gptfast"]["ok"]
    assert c["agreement"]["gptfast"]["rel_err"] < 1e-5


def test_kernels_per_step_reports_busy_idle_and_wall_minus_busy():
    """kernels_per_step's arithmetic on a CPU profile (aten ops stand in for the CUDA kernels)."""
    x = torch.randn(64, 64)
    k = variants.kernels_per_step(lambda: (x @ x).relu(), 3, wall_ms=5.0, cuda=False)
    assert k["steps"] == 3 and k["kernels"] >= 2 and 0 < k["busy_us"] <= k["span_us"]
    assert k["wall_us"] == 5000.0 and k["wall_idle_us"] == pytest.approx(5000.0 - k["busy_us"])
    assert "error" in variants.kernels_per_step(lambda: x, 2, wall_ms=1.0, cuda=False)     # no op: no kernel seen


def test_a_baseline_that_fails_to_compile_is_reported_and_the_run_goes_on(monkeypatch):
    model = build_model("tiny-dense", dtype=torch.float32)
    wl = make_workload(model, WorkloadPoint(phase="decode", batch=1, context=8), 0)
    seen = []

    def broken(module, mode="reduce-overhead"):
        def step(*args):
            seen.append(mode)
            raise RuntimeError("inductor: no lowering\nsecond line")
        return step

    monkeypatch.setattr(variants.gptfast, "compile_decode", broken)
    a = Namespace(no_compile=False, steps=2, repeats=1, samples=2, eager_samples=2, profile_steps=0)
    base = variants.gptfast_base(model, wl, bench.hf_config("tiny-dense"), 1, 8)
    timer = bench.timing.FairTimer(model.device, flush_bytes=1 << 16)
    for mode, name in variants.GPTFAST.items():
        row, entry, logits, kernels = variants.run_gptfast(base, a, timer, mode)
        assert entry is None and logits is None and kernels is None and row[f"{name}_compile_s"] is None
        assert row[f"{name}_note"] == "not measured: RuntimeError: inductor: no lowering"
    assert seen == list(variants.GPTFAST)


def test_skip_drops_variants_and_a_wrong_name_is_a_user_error(tmp_path, capsys):
    rc, doc = run(tmp_path, "--cases", "tiny-dense:all@1/16", "--skip", "gptfast,torch_compile")
    [c] = doc["cases"]
    assert rc == 0 and set(c["timings"]) == {"reference", "tkcc"} and doc["skipped"] == ["gptfast", "torch_compile"]
    assert c["gptfast_ms"] is None and c["gptfast_note"] == "not measured: --skip"
    assert c["ratios"]["vs_gptfast"] is None and c["ratios"]["vs_reference"] > 0
    rc, doc = run(tmp_path / "x", "--cases", "tiny-dense:all@1/16", "--skip", "tkcc")
    err = capsys.readouterr().err
    assert rc == 2 and doc is None and err.startswith("e2e_decode: error: --skip tkcc: variants are") and \
        err.count("\n") == 1


def test_the_plan_step_runs_as_the_plan_was_measured(tmp_path):
    """Issue 39: a plan measured against the compiled step runs compiled around its overrides (``--tkcc-step
    plan``, the default), an older plan (eager baseline) eagerly; ``--tkcc-step`` and ``--no-compile`` decide
    over it. The compiled path on CPU times the overrides inside inductor's step and still agrees."""
    vdir = write_plan(tmp_path / "plan", "rms-fp32", CORRECT)
    [parts] = bench.load_plans([str(vdir.parent)]).values()
    compiled = parts.loaded.plan.plan_speedup | {"baseline": baseline_words(True)}
    as_compiled = bench.PlanParts(dataclasses.replace(parts.loaded, plan=dataclasses.replace(
        parts.loaded.plan, plan_speedup=compiled)), parts.owned)

    def decide(p, step="plan", no_compile=False):
        return bench.tkcc_compiled(Namespace(tkcc_step=step, no_compile=no_compile), p)
    assert decide(as_compiled) and not decide(parts) and not decide(None)
    assert decide(parts, "compiled") and not decide(as_compiled, "eager") and not decide(as_compiled, no_compile=True)
    model = build_model("tiny-dense", dtype=torch.float32)
    wl = make_workload(model, WorkloadPoint(phase="decode", batch=1, context=8), 0)
    a = Namespace(steps=2, repeats=1, samples=2, eager_samples=2)
    timer = bench.timing.FairTimer(model.device, flush_bytes=1 << 16)
    case = bench.Case("tiny-dense", None, 1, 8)
    entry, logits, _ = bench.run_plan_step(model, wl, case, dict(parts.loaded.overrides), {}, timer, a, 0,
                                           compiled=True)
    assert entry["timed"] == "compiled" and bench.agreement(model.step(wl).float(), logits, model.dtype)["ok"]
