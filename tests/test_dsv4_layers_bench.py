"""benchmarks/dsv4_layers.py on CPU at toy size: one row per DeepSeek-V4 layer kind, each kind's own ops in its
split, the JSON written; and the shipped V4-Flash config's real-size layer shapes."""

import importlib.util
import json
import pathlib

import torch

from persistent_engine.models.deepseek_v4 import V4Config, param_shapes

BENCH = pathlib.Path(__file__).parents[1] / "benchmarks" / "dsv4_layers.py"


def _bench():
    spec = importlib.util.spec_from_file_location("dsv4_layers", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_shipped_config_parses_to_v4_flash_layers():
    c = json.loads(_bench().CONFIG.read_text())
    cfg = V4Config.from_hf(c)
    assert cfg.layer_ratios[:4] == (0, 0, 4, 128) and len(cfg.layer_ratios) == 43 and cfg.hc_mult == 4
    shapes = param_shapes(c, [2, 3])
    assert shapes["model.layers.2.self_attn.compressor.kv_proj.weight"] == (1024, 4096)      # CSA: 2 x head_dim
    assert shapes["model.layers.3.self_attn.compressor.kv_proj.weight"] == (512, 4096)       # HCA
    assert "model.layers.3.self_attn.compressor.indexer.kv_proj.weight" not in shapes
    layer = sum(torch.Size(s).numel() for n, s in shapes.items() if n.startswith("model.layers.2."))
    assert 6.4e9 < layer < 7.0e9                  # 256 experts x 3 x 4096 x 2048 + attention: ~6.6 B per layer


def test_cpu_tiny_run_writes_rows(tmp_path):
    out = tmp_path / "d.json"
    assert _bench().main(["--device", "cpu", "--tiny", "--samples", "1", "--tokens", "136", "--decode-batch", "8",
                          "--decode-context", "40", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    rows = {r["kind"]: r for r in doc["rows"]}
    dec = {r["kind"]: r for r in doc["decode"]}
    assert set(dec) == {"window+hash", "csa+hash", "hca+moe", "csa+moe"} and all(r["attention_ms"] > 0 for r in dec.values())
    assert dec["window+hash"]["peer_attention_ms"] is None and dec["csa+moe"]["peer_attention_ms"] > 0   # H200 peers
    assert dec["hca+moe"]["peer_attention_step"] == 32 and dec["csa+hash"]["peer_hc_pre_ms"] > 0      # nearest context
    assert "AIConfigurator" in doc["peers_source"]["source"]
    assert set(rows) == {"window+hash", "csa+hash", "hca+moe", "csa+moe"} and all(r["ms_per_layer"] > 0 for r in rows.values())
    ops = {k: set(r["ops_ms"]) for k, r in rows.items()}
    assert {"csa_indexer", "kv_compress", "moe_route"} <= ops["csa+moe"] and "moe_route_hash" not in ops["csa+moe"]
    assert "moe_route_hash" in ops["window+hash"] and "kv_compress" not in ops["window+hash"]
    assert {"moe_route_hash", "csa_indexer"} <= ops["csa+hash"]
    assert "kv_compress" in ops["hca+moe"] and "csa_indexer" not in ops["hca+moe"]
    assert {"hc_pre", "hc_post", "compressed_attention", "grouped_linear", "moe_experts_clamp"} <= ops["hca+moe"]


def test_the_template_kernels_load_from_their_files():
    bench = _bench()
    assert all(callable(bench._kernel(op)) for op in bench.KERNELS)


def test_peer_rows_match_batch_and_nearest_context():
    bench = _bench()
    peers = json.loads(bench.PEERS.read_text())
    row = bench.peer(peers, "csa_generation", 32, 4000)
    assert row["batch"] == 32 and row["step"] == 4096 and row["compress_ratio"] == 4 and row["latency_ms"] > 0
    assert bench.peer(peers, "hca_generation", 3, 4096) is None                 # no such batch measured
    assert bench.layer_kinds(bench.ModelSpec.from_name("deepseek")) == {"window+hash": 0, "csa+hash": 2, "hca+moe": 3,
                                                                         "csa+moe": 4}
