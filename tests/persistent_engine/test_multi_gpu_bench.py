"""benchmarks/multi_gpu.py: the formulas mode, the clear exit without GPUs, and its per-rank workers
(the code the GPU run uses) on 2 gloo ranks with a tiny model."""

import json
import sys
from pathlib import Path

import pytest
import torch
from persistent_engine.io_struct import WorkloadPoint

ROOT = Path(__file__).resolve().parents[2]


def _bench(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))   # spawned ranks inherit sys.path to import the workers
    import multi_gpu
    return multi_gpu


def test_formulas_compare_cost_model_with_published_figures(tmp_path, capsys, monkeypatch):
    from cost_model import get_hardware

    bench = _bench(monkeypatch)
    out = tmp_path / "f.json"
    assert bench.main(["--formulas", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert "published" in capsys.readouterr().out
    large = [r for r in data["rows"] if r["published_busbw_gbs"]]
    assert {r["op"] for r in large} == {"all_reduce", "all_to_all"}
    bw = get_hardware("h200").scale_up_bw / 1e9
    for r in large:   # the alpha-beta ring approaches the link bandwidth from below as messages grow
        assert 0.9 * bw < r["predicted_busbw_gbs"] <= bw
        assert r["ratio_to_published_mid"] == pytest.approx(r["predicted_busbw_gbs"] / sum(r["published_busbw_gbs"]) * 2)
    small = [r["predicted_busbw_gbs"] for r in data["rows"] if r["op"] == "all_reduce"]
    assert small == sorted(small)


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="this machine has several GPUs")
def test_gpu_mode_exits_2_with_one_line_without_gpus(tmp_path, capsys, monkeypatch):
    out = tmp_path / "g.json"
    assert _bench(monkeypatch).main(["--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("multi_gpu: needs >= 2 CUDA GPUs") and "\n" not in err
    assert not out.exists()


@pytest.mark.timeout(120)
def test_rank_workers_on_two_gloo_processes(monkeypatch):
    from persistent_engine.parallel import launch

    bench = _bench(monkeypatch)
    coll = launch(bench.collective_worker, 2, "gloo", args=([4096, 65536], 2, "cpu"))
    assert coll[0] == coll[1]                                   # the slowest rank's time, agreed by all
    assert [(r["op"], r["bytes"]) for r in coll[0]] == [("all_reduce", 4096), ("all_reduce", 65536),
                                                         ("all_to_all", 4096), ("all_to_all", 65536)]
    assert all(r["time_s"] > 0 for r in coll[0])
    point = WorkloadPoint(phase="decode", batch=2, context=20, chunk=1, weight=1.0)
    rows = launch(bench.decode_worker, 2, "gloo", args=("tiny-moe", None, 2, [point], 2, "cpu"))
    assert rows[0] == rows[1] and rows[0][0]["measured_s"] > 0 and rows[0][0]["batch"] == 2
