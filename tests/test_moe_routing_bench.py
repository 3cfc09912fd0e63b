"""benchmarks/moe_routing.py on CPU (the Triton template under TRITON_INTERPRET=1, tiny MoE shapes): the
routings it builds (balanced as AIConfigurator deals it, power law with distinct experts per token), the
2x2 cross timing of the two searches' winners, the wrong-choice cost and the JSON it writes."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "moe_routing.py"
spec = importlib.util.spec_from_file_location("moe_routing_under_test", SCRIPT)
mr = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = mr
spec.loader.exec_module(mr)


def test_routings_are_valid_and_differ():
    for t in (3, 16, 64):
        ids = mr.balanced_ids(t, 128, 8)
        assert ids.shape == (t, 8) and bool((ids.sort(-1).values.diff(dim=-1) > 0).all())
    bal = torch.bincount(mr.balanced_ids(64, 128, 8).flatten(), minlength=128)
    assert int(bal.max()) - int(bal.min()) <= 1                       # balanced: every expert 4 tokens
    x, w13, w2, tw, ids = mr.routed_inputs(mr.TINY, 16, "power_law", 1.2, "cpu", 0)
    assert ids.shape == (16, 4) and bool((ids.sort(-1).values.diff(dim=-1) > 0).all())
    pl = torch.bincount(ids.flatten(), minlength=16)
    assert int(pl.max()) > 2 * int(torch.bincount(mr.routed_inputs(mr.TINY, 16, "balanced", 1.2, "cpu", 0)[4]
                                                  .flatten(), minlength=16).max())
    assert mr.VLLM_H200_MS[(16, "balanced")] > mr.VLLM_H200_MS[(16, "power_law_1.2")]


@pytest.mark.slow
def test_cross_timing_on_cpu_interpreter(tmp_path):
    out = tmp_path / "mr.json"
    assert mr.run(["--device", "cpu", "--tiny", "--tokens", "4", "--budget", "1", "--samples", "1",
                   "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    r = doc["results"][0]
    assert doc["benchmark"] == "moe_routing" and doc["torch"] and "triton" in doc
    assert set(r["cross_us"]) == {f"{a}->{b}" for a in mr.DISTRIBUTIONS for b in mr.DISTRIBUTIONS}
    assert r["same_winner"] and r["wrong_choice_cost"] == {"balanced": 0.0, "power_law": 0.0}  # budget 1: the default
    assert "at 4 tokens" in doc["paragraph"]


def test_bad_arguments_exit_2(capsys):
    assert mr.run(["--device", "cpu", "--alpha", "nan"]) == 2
    assert mr.run(["--device", "cpu", "--tokens", "0"]) == 2
    assert "error:" in capsys.readouterr().err
