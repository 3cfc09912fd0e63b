"""The tiers' input realism as optimize builds it (compiler.search.inputs.tier_inputs): the fast tier balanced,
the slow tier Zipf tokens, the profile's prefix-cache hit rate and a power law (1.2 by default) or a
measured histogram; bad numbers and files are one InputError line. The report shows the skew and flags
optimizations whose tiers disagree on the winner."""

import dataclasses
import json

import pytest

from compiler.search import inputs
from compiler.plan.artifact import PointSpeedup
from compiler.plan.report import render, tiers_disagree
from persistent_engine import WorkloadPoint
from persistent_engine.models.spec import ModelSpec
from plan_samples import make_plan

MOE = ModelSpec.from_name("tiny-moe")


def test_defaults_power_law_on_the_slow_tier_only():
    t = inputs.tier_inputs(MOE, {"prefix_cache_hit_rate": 0.4})
    assert t["fast"] == {}
    assert t["slow"] == {"tokens": "zipf", "routing": {"kind": "power_law", "alpha": 1.2}, "prefix_share": 0.4}
    assert inputs.tier_inputs(MOE, {}, routing_skew=0)["slow"]["routing"] == {"kind": "uniform"}
    assert inputs.tier_inputs(MOE, {"prefix_cache_hit_rate": None}, routing_skew=2.0)["slow"]["prefix_share"] == 0.0


def test_histogram_files_and_bad_values(tmp_path):
    good = tmp_path / "h.json"
    good.write_text(json.dumps({"layers": [[5, 1, 1, 1, 1, 1, 1, 1], [1] * 8]}))
    r = inputs.tier_inputs(MOE, {}, routing_histogram=str(good))["slow"]["routing"]
    assert r["kind"] == "histogram" and r["histogram"][0][0] == 5 and r["source"] == "h.json"
    txt = tmp_path / "h.txt"
    txt.write_text("# per expert\n4 2 1 1 1 1 1 1\n")
    assert inputs.tier_inputs(MOE, {}, routing_histogram=str(txt))["slow"]["routing"]["histogram"] == [[4, 2, 1, 1, 1, 1, 1, 1]]
    for body, msg in (("[1, 2, 3]", "has 3 experts"), ("[1, -2, 1, 1, 1, 1, 1, 1]", "finite number >= 0"),
                      ("[0, 0, 0, 0, 0, 0, 0, 0]", "positive sum"), ('{"x": 1}', "per-expert numbers"),
                      ("one two", "not JSON")):
        bad = tmp_path / "bad.txt"
        bad.write_text(body)
        with pytest.raises(inputs.InputError, match=msg):
            inputs.tier_inputs(MOE, {}, routing_histogram=str(bad))
    for skew in (float("nan"), float("inf"), -0.5, 11.0):
        with pytest.raises(inputs.InputError, match="--routing-skew"):
            inputs.tier_inputs(MOE, {}, routing_skew=skew)


def test_report_shows_skew_and_flags_disagreeing_tiers():
    assert tiers_disagree(1.2, 0.97) and tiers_disagree(0.99, 1.1) and not tiers_disagree(1.2, 1.05)
    assert not tiers_disagree(1.02, 0.99, noise=0.05)       # within the noise: no winner on the fast tier
    plan = make_plan(version=2)
    o = plan.optimizations[0]
    o2 = dataclasses.replace(o, name="split", speedup={"fast": 1.3, "slow": 0.95},
                             per_point=(PointSpeedup(WorkloadPoint("decode", 8, 512), fast=1.3, slow=0.95),))
    tiers = {"fast": {"layers": [0], "inputs": {}},
             "slow": {"layers": [0, 1], "inputs": {"tokens": "zipf", "routing": {"kind": "power_law", "alpha": 1.2},
                                                   "prefix_share": 0.25},
                      "routing": {"top1_share": [0.2, 0.3], "near_tie_share": [0.0, 0.01], "margin_median": [1.5, 1.4],
                                  "fitted_share": 1.0}}}
    md = render(dataclasses.replace(plan, optimizations=(o, o2), tiers=tiers))["report.md"]
    assert "MoE routing power law 1.2" in md and "shared prefix 25%" in md and "hottest expert 20.0-30.0%" in md
    assert "| split | rms_norm | 1.300x | 0.950x | **yes** |" in md
    assert "indexer" in md


def test_weights_go_to_both_tiers_and_keep_their_routers(tmp_path):
    ckpt = tmp_path / "m.safetensors"
    ckpt.write_bytes(b"")
    t = inputs.tier_inputs(MOE, {"prefix_cache_hit_rate": 0.5}, weights=str(ckpt))
    assert t["fast"] == {"weights": str(ckpt)} and t["slow"]["weights"] == str(ckpt)
    assert "routing" not in t["slow"] and t["slow"]["prefix_share"] == 0.5
    with pytest.raises(inputs.InputError, match="trained routers"):
        inputs.tier_inputs(MOE, {}, routing_skew=1.2, weights=str(ckpt))
    with pytest.raises(inputs.InputError, match="weights not found"):
        inputs.tier_inputs(MOE, {}, weights=str(tmp_path / "none"))


def test_token_ids_logged_in_the_trace_feed_the_slow_tier(tmp_path):
    import pandas as pd

    rows = [{"timestamp": 0.5 * i, "input_tokens": 4, "output_tokens": 2, "token_ids": [i, i + 1, i + 2, i + 3]}
            for i in range(10)]
    jl = tmp_path / "t.jsonl"
    jl.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    pq = tmp_path / "t.parquet"
    pd.DataFrame(rows).to_parquet(pq)
    for path in (jl, pq):
        ids = inputs.traffic_token_ids(str(path), MOE.vocab_size)
        assert ids[:8] == [0, 1, 2, 3, 1, 2, 3, 4] and len(ids) == 40
    t = inputs.tier_inputs(MOE, {}, token_ids=ids)
    assert t["slow"]["tokens"] == {"ids": ids} and t["fast"] == {}
    assert inputs.inputs_summary(t["slow"])["tokens"] == "traffic (40 ids)"
    csv = tmp_path / "t.csv"
    csv.write_text("timestamp,input_tokens,output_tokens\n0,4,2\n")
    assert inputs.traffic_token_ids(str(csv), MOE.vocab_size) is None
    rows[3]["token_ids"] = [10 ** 6]
    jl.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(inputs.InputError, match="another tokenizer"):
        inputs.traffic_token_ids(str(jl), MOE.vocab_size)
