"""benchmarks/templates.py runs on CPU: searches the torch templates' knobs, checks them against the
reference, writes its JSON atomically and keeps the rows of models it did not measure."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("tkcc_bench_templates", ROOT / "benchmarks" / "templates.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    threads = torch.get_num_threads()
    yield mod
    torch.set_num_threads(threads)


def _argv(out, *extra):
    return ["--device", "cpu", "--batches", "1", "--chunk", "16", "--context", "32", "--ops", "rms_norm,silu_and_mul",
            "--budget", "2", "--samples", "5", "--out", str(out), *extra]


def test_benchmark_cpu_writes_rows_with_bandwidth(bench, tmp_path, capsys):
    out = tmp_path / "cpu-templates.json"
    assert bench.run(_argv(out, "--models", "tiny-dense")) == 0
    doc = json.loads(out.read_text())
    assert doc["device"] == "cpu" and doc["copy_bandwidth_gbs"] > 0 and not doc["truncated"]
    rows = doc["rows"]
    assert {(r["op"], r["phase"]) for r in rows} == {("rms_norm", "decode"), ("rms_norm", "prefill"),
                                                     ("silu_and_mul", "decode"), ("silu_and_mul", "prefill")}
    for row in rows:
        assert row["template"].startswith(row["op"] + ".") and row["settings_tried"] >= 1
        assert row["best_us"] > 0 and row["best_gbs"] > 0 and row["bytes"] > 0
        assert row["speedup"] == pytest.approx(row["reference_us"] / row["best_us"])
        assert set(row["best_knobs"]) and row["pct_of_measured_bw"] > 0
    printed = capsys.readouterr().out
    assert "rms_norm" in printed and "GB/s" in printed
    # a second model keeps the first one's rows; no temporary file is left behind
    assert bench.run(_argv(out, "--models", "tiny-moe")) == 0
    models = {row["model"] for row in json.loads(out.read_text())["rows"]}
    assert models == {"tiny-dense", "tiny-moe"}
    assert [p.name for p in tmp_path.iterdir()] == ["cpu-templates.json"]


def test_benchmark_refuses_cuda_without_a_gpu(bench, tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert bench.run(["--device", "cuda", "--out", str(tmp_path / "x.json")]) == 2
    assert "no CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_bytes_moved_counts_the_written_cache_rows_not_the_pools(bench):
    """The K/V-writing region: its caches count T rows each (written), not the whole pools."""
    from persistent_engine.ops import registry

    d = registry.get("add_rms_norm_qkv_rotary_kv_write")
    shape = d.examples[0]
    args = d.make_inputs(shape, torch.bfloat16, "cpu", 0)
    out = d.reference(*args)
    tensors = [a for i, a in enumerate(args) if torch.is_tensor(a) and i not in (11, 12)]
    want = sum(a.numel() * a.element_size() for a in (*tensors, *out))
    want += 2 * shape["T"] * shape["Hk"] * shape["Dh"] * 2              # bf16 rows of k_cache and v_cache
    assert bench.bytes_moved(d.name, args, out, d.writes) == want
    assert bench.bytes_moved(d.name, args, out) > want + args[11].numel() * 2    # without: whole pools read


@pytest.mark.parametrize("op", ["attention_decode", "attention_prefill"])
def test_bytes_moved_of_attention_is_each_sequences_context_not_the_pool(bench, op):
    """Paged attention reads each sequence's context_lens[b] tokens of K and V (not the pool's spare blocks), its
    queries, and writes its output."""
    from persistent_engine.ops import registry

    d = registry.get(op)
    args = d.make_inputs(d.examples[0], torch.bfloat16, "cpu", 0)
    q, kc, vc, cl, out = args[0], args[1], args[2], args[-2], d.reference(*args)
    per_tok = kc.shape[2] * (kc.shape[3] + vc.shape[3]) * 2
    want = int(cl.sum()) * per_tok + (q.numel() + out.numel()) * 2
    assert bench.bytes_moved(op, args, out) == want < sum(a.numel() * 2 for a in (q, kc, vc, out))
