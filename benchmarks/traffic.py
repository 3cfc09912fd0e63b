"""Benchmark: profile a 1,000,000-request canonical parquet (with hash_ids of 512-token blocks, as in
Mooncake), time and peak memory.

    python benchmarks/traffic.py [--rows 1000000] [--lru-blocks N]

Writes the synthetic parquet to a temp directory, then profiles it in a fresh child process (read +
validate + profile, as ``tkcc traffic profile`` does) so that the peak RSS measured is the profile's
alone. Target (issue 4): < 10 s and < 2 GB on a 2-core machine. Also times the workload replay of
the Azure conversation trace. Prints a table; writes ``benchmarks/results/traffic.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import sys, time, json
t0 = time.perf_counter()
from traffic_profiles import ProfileConfig, build_profile, read_trace
t1 = time.perf_counter()
trace = read_trace(sys.argv[1])
t2 = time.perf_counter()
lru = int(sys.argv[2])
p = build_profile(trace, ProfileConfig(lru_blocks=lru or None))
t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "read_s": t2 - t1, "profile_s": t3 - t2, "rows": p.rows,
                  "blocks": int(len(trace.hash_values)), "hit_rate": p.prefix_cache_hit_rate}))
"""


def bench_profile(rows: int, lru_blocks: int) -> dict:
    from traffic_profiles import SynthConfig, generate, write_parquet
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.parquet"
        t0 = time.perf_counter()
        write_parquet(generate(SynthConfig(rows=rows, rate=300.0, block_size=512, seed=0)), path)
        gen_s = time.perf_counter() - t0
        size = path.stat().st_size
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", CHILD, str(path), str(lru_blocks)], capture_output=True,
                             text=True, cwd=ROOT, check=True)
        wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024    # Linux: KiB
    return {"rows": rows, "parquet_bytes": size, "generate_s": gen_s, "wall_s": wall, "peak_rss_bytes": peak,
            **json.loads(out.stdout)}


def bench_replay() -> dict:
    from traffic_profiles import RooflineStepTime, SchedulerConfig, read_trace, replay
    trace = read_trace(ROOT / "examples" / "traffic" / "azure2023_conv.parquet")
    roof = RooflineStepTime(weight_bytes=2.47e9, kv_bytes_per_token=32768, flops_per_token=2.47e9,
                            bandwidth=3.84e12, flops=5.93e14, attn_flops_per_pair=131072)
    t0 = time.perf_counter()
    w = replay(trace, roof, SchedulerConfig(max_num_seqs=256))
    return {"requests": trace.rows, "replay_s": time.perf_counter() - t0, "points": len(w.points)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--lru-blocks", type=int, default=0, help="also simulate an LRU cache (slower)")
    args = ap.parse_args()
    prof = bench_profile(args.rows, args.lru_blocks)
    rep = bench_replay()
    ok = prof["wall_s"] < 10 and prof["peak_rss_bytes"] < 2e9
    print(f"{'what':44} {'figure':>14}")
    print(f"{'requests profiled':44} {prof['rows']:>14,}")
    print(f"{'hash blocks':44} {prof['blocks']:>14,}")
    print(f"{'parquet size (MB)':44} {prof['parquet_bytes'] / 1e6:>14.1f}")
    print(f"{'profile wall time, child process (s)':44} {prof['wall_s']:>14.2f}")
    print(f"{'  of which import / read / profile (s)':44} "
          f"{prof['import_s']:.2f} / {prof['read_s']:.2f} / {prof['profile_s']:.2f}")
    print(f"{'peak memory, child process (GB)':44} {prof['peak_rss_bytes'] / 1e9:>14.2f}")
    print(f"{'target < 10 s and < 2 GB':44} {'met' if ok else 'MISSED':>14}")
    print(f"{'replay Azure conv, llama-1b, 256 seqs (s)':44} {rep['replay_s']:>14.2f}")
    result = {"benchmark": "traffic", "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                                  "platform": platform.platform()},
              "profile": prof, "replay": rep, "target_met": ok}
    out = ROOT / "benchmarks" / "results" / "traffic.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, out)
    print(f"wrote {out.relative_to(ROOT)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
