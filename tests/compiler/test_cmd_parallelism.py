"""``tkcc parallelism``: table, --json contract fields, exit codes, --traffic."""
import json

import pytest

from compiler.cli import main
from persistent_engine.io_struct import WorkloadPoint

FIELDS = {"tp", "pp", "ep", "dp", "dcp", "dtype", "fits", "tokens_per_s_per_gpu", "tokens_per_s_per_user",
          "ttft_ms", "tpot_ms", "pareto"}


def test_json_contract(capsys):
    rc = main(["parallelism", "--model", "llama-8b", "--hw", "h200", "--gpus", "1", "--json"])
    out = capsys.readouterr().out
    d = json.loads(out)
    assert rc == 0 and out.count("\n") == 1
    assert d["configs"] and all(FIELDS <= set(c) for c in d["configs"])
    assert d["best"]["tp"] == 1 and d["best"]["fits"]


def test_table_and_impossible_sla(capsys):
    rc = main(["parallelism", "--model", "llama-8b", "--hw", "h200", "--gpus", "1", "--tpot-ms", "0.5"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "no configuration meets TPOT <= 0.5 ms" in out and "tok/s/GPU" in out


def test_unknown_hardware_exit_2(capsys):
    rc = main(["parallelism", "--model", "llama-8b", "--hw", "tpu9", "--gpus", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "unknown hardware 'tpu9'" in err


def test_traffic_points_file(tmp_path, capsys):
    pts = [WorkloadPoint(phase="prefill", batch=1, context=0, chunk=4096, weight=0.4),
           WorkloadPoint(phase="decode", batch=64, context=4352, chunk=1, weight=0.6)]
    f = tmp_path / "points.json"
    f.write_text(json.dumps([p.to_dict() for p in pts]))
    rc = main(["parallelism", "--model", "llama-8b", "--hw", "h100", "--gpus", "2", "--traffic", str(f), "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["traffic"]["isl"] == 4096 and d["traffic"]["osl"] == 512
    rc = main(["parallelism", "--model", "llama-8b", "--hw", "h100", "--gpus", "2", "--traffic", str(tmp_path / "no.json")])
    assert rc == 2


def test_traffic_trace_file(tmp_path, capsys):
    f = tmp_path / "azure.csv"
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"] + [
        f"2023-11-16 18:15:{i:02d}.0000000,{2000 + 10 * i},{100 + i}" for i in range(40)]
    f.write_text("\n".join(rows) + "\n")
    rc = main(["parallelism", "--model", "llama-8b", "--hw", "h200", "--gpus", "1", "--traffic", str(f), "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and 2000 <= d["traffic"]["isl"] <= 2400 and 100 <= d["traffic"]["osl"] <= 140


def test_objective_and_quantized_flag(capsys):
    rc = main(["parallelism", "--model", "llama-8b", "--hw", "h200", "--gpus", "1"])
    out = capsys.readouterr().out
    assert rc == 0 and "objective: no SLA given" in out and "--allow-quantized" in out
    rc = main(["parallelism", "--model", "llama-8b", "--hw", "h200", "--gpus", "1", "--allow-quantized", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["allow_quantized"] and "TPOT <= 50 ms" in d["objective"]
    assert all({"quality", "stable", "kv_dtype"} <= set(c) for c in d["configs"])


def test_json_carries_serving_flags_per_layout(capsys):
    """Every config names its framework, sharding and per-framework flags (or why not); the table
    prints the best config's flags; SGLang layouts launch with SGLang's own spelling."""
    from cost_model.sharding import parse_flags

    rc = main(["parallelism", "--model", "qwen3-moe", "--hw", "h200", "--gpus", "8", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0
    for c in d["configs"]:
        sh = c["sharding"]
        assert c["framework"] == "vllm" and sh["experts"] * sh["expert_tp"] == c["tp"] * c["dp"]
        flags = c["serving"]["vllm"]["flags"]
        assert flags is not None
        back = parse_flags("vllm", flags, c["dtype"])
        assert (back.tp, back.dp, back.ep, back.pp) == (c["tp"], c["dp"], c["ep"], c["pp"])
        sg = c["serving"]["sglang"]
        assert sg["flags"] is not None or sg["reason"]
    rc = main(["parallelism", "--model", "qwen3-moe", "--hw", "h200", "--gpus", "8", "--framework", "sglang"])
    out = capsys.readouterr().out
    assert rc == 0 and "sglang flags: --tp-size" in out and "vllm" in out
    with pytest.raises(SystemExit) as e:                 # argparse: one line, exit 2
        main(["parallelism", "--model", "qwen3-moe", "--hw", "h200", "--gpus", "8", "--framework", "trt"])
    assert e.value.code == 2 and "invalid choice: 'trt'" in capsys.readouterr().err


def test_gpt_oss_lays_out_in_bf16_with_mxfp4_experts(capsys):
    """gpt-oss's checkpoint quantizes only its experts (MXFP4, costed at 4.25 bits): its layouts are bf16 ones, and
    120B fits one H200 (the experts ~66 GB instead of ~250 GB in bf16)."""
    rc = main(["parallelism", "--model", "gpt-oss", "--hw", "h200", "--gpus", "1", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["best"]["dtype"] == "bf16" and d["best"]["fits"] and d["best"]["tp"] == 1
