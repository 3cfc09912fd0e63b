import json
from dataclasses import replace

import numpy as np
import pytest
from scipy import stats as sp

from traffic_profiles import (DriftThresholds, ProfileConfig, SynthConfig, Trace, TraceError, TrafficProfile,
                              build_profile, compare, generate, profile_file)
from traffic_profiles import cache, stats
from traffic_profiles.synth import variant


def test_numpy_effect_sizes_match_scipy(code_trace, conv_trace):
    a, b = code_trace.input_tokens, conv_trace.input_tokens
    assert stats.ks_statistic(a, b) == pytest.approx(sp.ks_2samp(a, b).statistic, abs=1e-12)
    assert stats.wasserstein(a, b) == pytest.approx(sp.wasserstein_distance(a, b), rel=1e-9)
    ha, hb = stats.histogram(a), stats.histogram(b)
    assert stats.ks_from_hist(ha, hb) == pytest.approx(stats.ks_statistic(a, b), abs=0.01)
    assert stats.wasserstein_from_hist(ha, hb) == pytest.approx(stats.wasserstein(a, b), rel=0.02)


def test_azure_profiles_reproduce_reference_figures(code_trace, conv_trace):
    pc, pv = build_profile(code_trace), build_profile(conv_trace)
    assert (pc.rows, pv.rows) == (8819, 19366)
    assert pc.duration_s / 3600 == pytest.approx(0.95, abs=0.01)
    assert pc.interarrival_cv > 10 and 0.9 < pv.interarrival_cv < 1.3     # very bursty vs near Poisson
    assert pc.prefix_cache_hit_rate is None and pv.input_tokens["p50"] == 1020
    report = compare(pc, pv)
    byname = {f.name: f for f in report.features}
    assert byname["input_tokens.ks"].statistic == pytest.approx(0.35, abs=0.01)
    assert byname["output_tokens.ks"].statistic == pytest.approx(0.81, abs=0.01)
    assert report.drift
    assert {"input_tokens.ks", "output_tokens.ks", "interarrival_cv", "fano_1s"} <= set(report.drifted)
    assert byname["prefix_cache_hit_rate"].statistic is None and not byname["prefix_cache_hit_rate"].drifted


@pytest.mark.parametrize("which", ["code_trace", "conv_trace"])
def test_halves_are_not_drift(request, which):
    first, second = request.getfixturevalue(which).halves()
    report = compare(build_profile(first), build_profile(second))
    ks = [f.statistic for f in report.features if f.name.endswith(".ks")]
    assert all(0.02 <= k <= 0.085 for k in ks), ks
    assert not report.drift, report.drifted


BASE = SynthConfig(rows=8000, seed=3)


@pytest.mark.parametrize("name,feature", [("longer", "input_tokens.ks"), ("cold", "prefix_cache_hit_rate"),
                                          ("bursty", "interarrival_cv")])
def test_synthetic_drift_and_seed_control(name, feature):
    base = build_profile(generate(BASE))
    drifted = compare(base, build_profile(generate(replace(variant(BASE, name), seed=11))))
    assert drifted.drift and feature in drifted.drifted
    same = compare(base, build_profile(generate(replace(BASE, seed=11))))
    assert not same.drift, same.drifted


def test_cold_variant_is_0_2_lower_hit_rate():
    hot = build_profile(generate(BASE)).prefix_cache_hit_rate
    cold = build_profile(generate(variant(BASE, "cold"))).prefix_cache_hit_rate
    assert hot - cold == pytest.approx(0.2, abs=0.03)


def test_profile_json_is_stable_and_hashed(tmp_path, conv_trace):
    p = build_profile(conv_trace)
    path = tmp_path / "p.json"
    p.save(path)
    text = path.read_text()
    assert json.loads(text)["hash"] == p.hash and p.hash.startswith("sha256:")
    again = TrafficProfile.load(path)
    assert again.to_dict() == p.to_dict() and profile_file(path).hash == p.hash
    assert build_profile(conv_trace.take(slice(0, conv_trace.rows))).hash == p.hash     # same content
    assert build_profile(conv_trace.take(slice(1, conv_trace.rows))).hash != p.hash
    d = json.loads(text)
    d["rows"] += 1
    path.write_text(json.dumps(d))
    with pytest.raises(TraceError, match="does not match its hash"):
        TrafficProfile.load(path)


def _trace(hashes, inp, block=4):
    offsets = np.cumsum([0] + [len(h) for h in hashes])
    n = len(hashes)
    return Trace(timestamp_s=np.arange(n, dtype=float), input_tokens=np.asarray(inp),
                 output_tokens=np.ones(n, dtype=np.int64), hash_offsets=offsets,
                 hash_values=np.asarray([x for h in hashes for x in h] or [], dtype=np.int64), block_size=block)


def test_prefix_hits_unbounded_lru_and_sessions():
    # 0: [1,2]; 1: [1,2,3] extends 0 (session); 2: [5]; 3: [1,9]; 4: [1,2,3,4] extends 1; 5: [7,8] new
    t = _trace([[1, 2], [1, 2, 3], [5], [1, 9], [1, 2, 3, 4], [7, 8]], [8, 10, 4, 8, 16, 8])
    assert cache.unbounded_hits(t).tolist() == [0, 8, 0, 4, 12, 0]
    assert cache.lru_hits(t, 100).tolist() == cache.unbounded_hits(t).tolist()
    # LRU of 2 blocks: row 1 hits [1,2], then 3 evicts 1; row 3 misses 1 (evicted); row 4 hits 1, misses 2
    assert cache.lru_hits(t, 2).tolist() == [0, 8, 0, 0, 4, 0]
    sess = cache.infer_sessions(t)
    assert sess[0] == sess[1] == sess[4] and len({sess[2], sess[3], sess[5], sess[0]}) == 4
    p = build_profile(t, ProfileConfig(lru_blocks=2))
    assert p.prefix_cache_hit_rate == pytest.approx(24 / 54, abs=1e-5)
    assert p.prefix_cache["lru"] == pytest.approx(12 / 54, abs=1e-5)
    assert p.sessions["count"] == 4 and p.sessions["max_turns"] == 3


def test_thresholds_are_configurable(code_trace):
    first, second = code_trace.halves()
    strict = compare(build_profile(first), build_profile(second), DriftThresholds(rate=0.1))
    assert strict.drifted == ["requests_per_s"]
