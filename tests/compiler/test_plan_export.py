"""``tkcc plan export --to vllm`` without vLLM: the op -> vLLM layer mapping, the not-exported list, the
``vllm serve`` flags, a tampered plan (exit 2, nothing written), and the package runtime's adapters and
fallbacks run on torch tensors (the vLLM run itself: test_plan_export_vllm.py)."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from compiler.export import vllm_package as ex
from compiler.export import vllm_plugin_runtime as rt
from compiler.cli import main
from persistent_engine.ops.attention import rope_cache, rotary_embedding
from persistent_engine.ops.basic import fused_add_rms_norm, rms_norm, silu_and_mul
from plan_samples import make_plan
from vllm_export_samples import HIDDEN, INTER, render, write_checkpoint, write_plan

REPO = Path(__file__).resolve().parents[2]
QWEN = REPO / "examples" / "plans" / "qwen3-moe-h200"


def test_example_plan_exports_its_layer_kernels_verbatim_and_lists_the_rest(tmp_path, capsys):
    assert main(["plan", "export", "--plan", str(QWEN), "--to", "vllm", str(tmp_path / "pkg")]) == 0
    out = capsys.readouterr().out
    m = json.loads((tmp_path / "pkg" / "tkcc_plan_qwen3_moe_v6" / "manifest.json").read_text())
    assert {e["op"] for e in m["exported"]} == {"rms_norm", "fused_add_rms_norm", "rotary_embedding"}
    assert {s["op"]: s["reason"].split(";")[0] for s in m["not_exported"]} == {
        "attention_decode": "vLLM's attention runs in its attention backends over their own KV-cache layout, not a "
                            "CustomOp with tkcc's paged signature",
        "moe_experts": "vLLM's FusedMoE routes, quantizes and shards experts inside one layer (its quant method)",
        "add_rms_norm_linear": "a tkcc fused region spanning several vLLM layers"}
    for e in m["exported"]:        # byte for byte, Triton kernels GPU only, verified on the model's own widths
        assert (tmp_path / "pkg" / m["package"] / e["kernel"]).read_bytes() == (QWEN / "v6" / e["kernel"]).read_bytes()
        assert e["needs_gpu"] and e["dtypes"] == ["float32", "bfloat16"]
    dims = {e["op"]: e["dims"] for e in m["exported"]}
    assert dims == {"rms_norm": [128, 2048], "fused_add_rms_norm": [2048], "rotary_embedding": [[128, 128]]}
    assert sorted({lay["class"]: lay["ops"] for lay in m["layers"]}["RMSNorm"]) == ["fused_add_rms_norm", "rms_norm"]
    assert "exported rotary_embedding -> RotaryEmbedding, Llama3RotaryEmbedding" in out
    assert "serve: vllm serve MODEL --dtype bfloat16 --quantization fp8 --max-num-seqs 776" in out
    readme = (tmp_path / "pkg" / "README.md").read_text()
    assert "## Not exported" in readme and "moe_experts" in readme and "(Triton kernel: GPU only)" in readme
    toml = (tmp_path / "pkg" / "pyproject.toml").read_text()
    assert ('[project.entry-points."vllm.general_plugins"]\n'
            'tkcc_plan_qwen3_moe_v6 = "tkcc_plan_qwen3_moe_v6:register"') in toml


def test_tampered_plan_is_one_line_exit_2_and_writes_nothing(tmp_path):
    plan = tmp_path / "plan"
    v = write_plan(plan, "tiny-dense")
    kernel = next((v / "kernels").glob("rms_norm_*.py"))
    kernel.write_text(kernel.read_text() + "\n# edited\n")
    r = subprocess.run([sys.executable, "-m", "compiler", "plan", "export", "--plan", str(plan), "--to", "vllm",
                        str(tmp_path / "out" / "pkg")], capture_output=True, text=True, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "does not match its sha256" in r.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_out_that_is_not_empty_is_refused_and_left_alone(tmp_path, capsys):
    write_plan(tmp_path / "plan", "tiny-dense")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mine.txt").write_text("keep")
    assert main(["plan", "export", "--plan", str(tmp_path / "plan"), "--to", "vllm", str(tmp_path / "pkg")]) == 2
    assert "already exists" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "pkg").iterdir()] == ["mine.txt"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_fused_unmapped_and_unnamed_ops_are_not_exported_with_their_reason(tmp_path):
    extra = {"add_rms_norm_linear": render("add_rms_norm_linear.torch_fused"), "linear": render("linear.torch_small_m")}
    write_plan(tmp_path / "plan", "tiny-dense", extra=extra)
    _, _, m, kernels = ex.build(tmp_path / "plan")
    reasons = {s["op"]: s["reason"] for s in m["not_exported"]}
    assert reasons["add_rms_norm_linear"].startswith("a tkcc fused region")
    assert reasons["linear"].startswith("vLLM's linear layers dispatch to their quantization method")
    assert set(kernels) == {e["kernel"] for e in m["exported"]}          # only exported kernels are shipped
    assert not any(e["needs_gpu"] for e in m["exported"])                 # torch sources run anywhere
    plan = make_plan(optimizations=(dataclasses.replace(make_plan().optimizations[0], targets=("silu_and_mul",)),))
    exported, skipped, _ = ex.classify(plan, {plan.optimizations[0].kernel: render("rms_norm.torch_fused")}, None)
    assert exported == [] and skipped[0]["reason"] == "its kernel's OVERRIDES literal does not name it"


BEST = {"tp": 1, "pp": 1, "ep": 1, "dp": 1, "dcp": 1, "dtype": "bf16", "kv_dtype": "bf16", "batch": 64}


@pytest.mark.parametrize("best, config, flags, not_flags", [
    (BEST, {}, ["--dtype", "bfloat16", "--max-num-seqs", "64"], []),
    ({**BEST, "tp": 4, "dp": 2, "ep": 8, "pp": 2, "dtype": "fp8", "kv_dtype": "fp8"}, {},
     ["--tensor-parallel-size", "4", "--pipeline-parallel-size", "2", "--data-parallel-size", "2",
      "--enable-expert-parallel", "--dtype", "bfloat16", "--quantization", "fp8", "--kv-cache-dtype", "fp8",
      "--max-num-seqs", "64"], []),
    ({**BEST, "tp": 4, "ep": 2, "dcp": 2, "dtype": "fp4", "replicas": 3, "pd": "disaggregated"}, {},
     ["--tensor-parallel-size", "4", "--decode-context-parallel-size", "2", "--max-num-seqs", "64"],
     ["ep", "dtype", "replicas", "pd"]),
    (BEST, {"max_num_seqs": 8, "max_num_batched_tokens": 512, "cuda_graph": False, "cuda_graph_batch_sizes": [1, 2]},
     ["--enforce-eager", "--max-num-batched-tokens", "512", "--max-num-seqs", "8", "--dtype", "bfloat16"],
     ["parallelism batch"]),
    (BEST, {"cuda_graph_batch_sizes": [8, 1, 2], "kv_block_size": 32, "max_chunk_tokens": 256},
     ["--compilation-config", '{"cudagraph_capture_sizes": [1, 2, 8]}', "--block-size", "32",
      "--long-prefill-token-threshold", "256", "--dtype", "bfloat16", "--max-num-seqs", "64"], []),
])
def test_serve_flags_of_layout_and_engine_settings(best, config, flags, not_flags):
    got, skipped = ex.serve_flags(make_plan(parallelism={"configs": [], "best": best}), config)
    assert got == flags
    assert [s["setting"] for s in skipped] == not_flags


def test_a_plan_without_a_layout_says_why_and_gives_no_layout_flags():
    plan = make_plan(parallelism={"best": None, "configs": [], "message": "no layout fits in memory"})
    assert ex.serve_flags(plan, {}) == ([], [{"setting": "parallelism", "value": None,
                                              "reason": "no layout fits in memory"}])


# ---------------------------------------------------------------- the package runtime, on torch tensors
def _kernel(op: str, fn, dims, *, needs_gpu=False) -> rt.Kernel:
    return rt.Kernel(op, fn, {"dtypes": ["float32", "bfloat16"], "dims": dims, "needs_gpu": needs_gpu})


def _norm_layer(d=HIDDEN, **kw):
    base = dict(has_weight=True, variance_size_override=None, weight=1 + 0.1 * torch.randn(d), variance_epsilon=1e-5)
    return SimpleNamespace(**(base | kw))


def test_norm_adapter_runs_the_kernel_on_verified_calls_and_falls_back_on_the_rest():
    kernels = {"rms_norm": _kernel("rms_norm", rms_norm, [HIDDEN]),
               "fused_add_rms_norm": _kernel("fused_add_rms_norm", fused_add_rms_norm, [HIDDEN])}
    layer, x, r = _norm_layer(), torch.randn(5, HIDDEN), torch.randn(5, HIDDEN)
    op, y = rt.rms_norm_adapter(layer, kernels, x)
    assert op == "rms_norm" and torch.equal(y, rms_norm(x, layer.weight, 1e-5))
    op, (y, s) = rt.rms_norm_adapter(layer, kernels, x, r)
    assert op == "fused_add_rms_norm" and torch.allclose(s, x + r)
    for layer_, x_, r_ in ((layer, x.half(), None), (_norm_layer(64), torch.randn(5, 64), None),
                           (_norm_layer(has_weight=False), x, None), (_norm_layer(variance_size_override=64), x, r),
                           (layer, x, r.to(torch.bfloat16))):
        assert rt.rms_norm_adapter(layer_, kernels, x_, r_)[1] is rt.FALLBACK
    gpu_only = {"rms_norm": _kernel("rms_norm", rms_norm, [HIDDEN], needs_gpu=True)}
    assert rt.rms_norm_adapter(layer, gpu_only, x)[1] is rt.FALLBACK         # a Triton kernel on a CPU tensor


def test_glu_and_rotary_adapters_match_the_reference_ops_and_fall_back_outside_them():
    silu = {"silu_and_mul": _kernel("silu_and_mul", silu_and_mul, [2 * INTER])}
    x = torch.randn(3, 2 * INTER)
    assert torch.equal(rt.ADAPTERS["silu_and_mul"](SimpleNamespace(), silu, x)[1], silu_and_mul(x))
    assert rt.ADAPTERS["silu_and_mul"](SimpleNamespace(), silu, torch.randn(3, 64))[1] is rt.FALLBACK
    gelu = {"gelu_tanh_and_mul": _kernel("gelu_tanh_and_mul", silu_and_mul, [2 * INTER])}
    assert rt.ADAPTERS["gelu_tanh_and_mul"](SimpleNamespace(approximate="none"), gelu, x)[1] is rt.FALLBACK
    rope = {"rotary_embedding": _kernel("rotary_embedding", rotary_embedding, [[64, 64]])}
    layer = SimpleNamespace(head_size=64, rotary_dim=64, is_neox_style=True, cos_sin_cache=rope_cache(256, 64))
    pos, q, k = torch.tensor([0, 5, 9]), torch.randn(3, 2 * 64), torch.randn(3, 64)
    op, (qo, ko) = rt.rotary_adapter(layer, rope, pos, q, k)
    rq, rk = rotary_embedding(pos, q.view(3, 2, 64), k.view(3, 1, 64), layer.cos_sin_cache, 64)
    assert op == "rotary_embedding" and qo.shape == q.shape and torch.equal(qo, rq.reshape(3, 128))
    assert torch.equal(ko, rk.reshape(3, 64))
    assert rt.rotary_adapter(layer, rope, pos, q, None)[1] is rt.FALLBACK
    assert rt.rotary_adapter(SimpleNamespace(**{**vars(layer), "is_neox_style": False}), rope, pos, q, k)[1] \
        is rt.FALLBACK


def test_the_package_runtime_refuses_a_kernel_edited_after_export(tmp_path):
    ck = write_checkpoint(tmp_path / "ckpt")
    write_plan(tmp_path / "plan", str(ck / "config.json"))
    m = ex.export(tmp_path / "plan", tmp_path / "pkg")
    entry = m["exported"][0]
    pkg = tmp_path / "pkg" / m["package"]
    assert rt._load_kernel(pkg, entry) is not None
    (pkg / entry["kernel"]).write_text((pkg / entry["kernel"]).read_text() + "\n")
    with pytest.raises(ValueError, match="does not match its sha256"):
        rt._load_kernel(pkg, entry)


def test_a_plan_of_an_unknown_model_or_without_a_layout(tmp_path, capsys):
    write_plan(tmp_path / "plan", "no-such-model")
    assert main(["plan", "export", "--plan", str(tmp_path / "plan"), "--to", "vllm", str(tmp_path / "pkg")]) == 2
    err = capsys.readouterr().err
    assert "cannot resolve the plan's model 'no-such-model'" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "pkg").exists()
    deepseek = REPO / "examples" / "plans" / "deepseek-h200"
    assert main(["plan", "export", "--plan", str(deepseek), "--to", "vllm", str(tmp_path / "ds"), "--json"]) == 0
    m = json.loads(capsys.readouterr().out)
    assert m["exported"] == [] and m["serve_flags"] == [] and m["layers"] == []
    assert m["flags_not_exported"][0]["reason"].startswith("deepseek on 1x h200: no layout fits in memory")
    assert "Nothing: no kernel of the plan maps to a vLLM layer" in (tmp_path / "ds" / "README.md").read_text()
