"""``tkcc traffic profile FILE`` and ``tkcc traffic diff OLD NEW`` (DESIGN.md "CLI").

profile: a readable table, or with ``--json`` the profile document (``rows``, ``duration_s``,
``requests_per_s``, ``input_tokens``/``output_tokens`` ``{mean, p50, p90, p99, max, ...}``,
``interarrival_cv``, ``prefix_cache_hit_rate``, ... and ``hash``); ``--out P.json`` also saves it.
``--workload --model M`` replays the trace through the scheduler model with a roofline step time of
model M (from ``persistent_engine.models.spec``, pure data) and adds ``workload`` (``points``,
``summary``, ``scheduler``).
diff: OLD and NEW are traces or saved profiles; exit 0 no drift, 1 drift, 2 bad input.
"""

from __future__ import annotations

import json
import sys

from compiler.validate import UsageError as _UsageError
from compiler.validate import count, input_file, nonneg_float, output_file, positive_float

# Default roofline: H200 at the achievable fractions seen in practice (shared/reference): 0.8 of the
# 4.8 TB/s datasheet bandwidth and 0.6 of 989 dense BF16 TFLOP/s.
DEFAULT_BANDWIDTH_GBS = 0.8 * 4800.0
DEFAULT_TFLOPS = 0.6 * 989.0


def register(subparsers) -> None:
    p = subparsers.add_parser("traffic", help="profile a request log, or diff two for drift")
    sub = p.add_subparsers(dest="traffic_command", metavar="{profile,diff}")
    sub.required = True

    prof = sub.add_parser("profile", help="profile a request log (table, or --json)")
    prof.add_argument("file", help="trace (canonical parquet, Azure CSV, Mooncake JSONL, BurstGPT CSV)")
    prof.add_argument("--json", action="store_true", help="print one JSON document")
    prof.add_argument("--out", metavar="PROFILE.json", help="also save the profile here")
    prof.add_argument("--block-size", type=count(1), help="tokens per hash_ids block (default: from the file)")
    prof.add_argument("--lru-blocks", type=count(1), help="also simulate an LRU prefix cache of N blocks")
    w = prof.add_argument_group("workload points")
    w.add_argument("--workload", action="store_true", help="replay the trace and print workload points")
    w.add_argument("--model", help="model alias or config.json path (needed with --workload)")
    w.add_argument("--max-num-seqs", type=count(1), default=256)
    w.add_argument("--max-num-batched-tokens", type=count(1), default=8192)
    w.add_argument("--kv-capacity-tokens", type=count(1), help="KV cache size in tokens (default unbounded)")
    w.add_argument("--no-prefix-caching", action="store_true")
    w.add_argument("--time-scale", type=positive_float, default=1.0, help="replay N times faster (N x the load)")
    w.add_argument("--max-points", type=count(1), default=16)
    w.add_argument("--bandwidth-gbs", type=positive_float, default=DEFAULT_BANDWIDTH_GBS,
                   help=f"achievable memory bandwidth, GB/s (default {DEFAULT_BANDWIDTH_GBS:g}, H200)")
    w.add_argument("--tflops", type=positive_float, default=DEFAULT_TFLOPS,
                   help=f"achievable TFLOP/s (default {DEFAULT_TFLOPS:g}, H200 BF16)")
    prof.set_defaults(func=_profile)

    diff = sub.add_parser("diff", help="drift of NEW against OLD (exit 0 none, 1 drift)")
    diff.add_argument("old", help="trace or saved profile JSON")
    diff.add_argument("new", help="trace or saved profile JSON")
    diff.add_argument("--json", action="store_true", help="print one JSON document")
    from traffic_profiles import DriftThresholds   # light: no pandas
    for name in DriftThresholds.names():
        diff.add_argument("--" + name.replace("_", "-"), type=nonneg_float, default=getattr(DriftThresholds, name),
                          metavar="X", help=f"threshold (default {getattr(DriftThresholds, name):g})")
    diff.set_defaults(func=_diff)


# ---------------------------------------------------------------------------- profile
def _step_time(args):
    from persistent_engine.models.spec import ModelSpec
    from traffic_profiles import RooflineStepTime
    spec = ModelSpec.from_name(args.model)
    if spec.attention == "mla":     # absorbed MLA: scores over latent + rope dims, values over latent
        per_head = spec.kv_lora_rank + spec.qk_rope_head_dim + spec.kv_lora_rank
    else:                           # scores over Dh, values over Dv (Gemma-4: each layer's)
        n = spec.num_layers
        per_head = sum(spec.layer_head_dim(i) + spec.layer_v_head_dim(i) for i in range(n)) / n
    return RooflineStepTime(
        weight_bytes=spec.weight_bytes(), kv_bytes_per_token=spec.kv_bytes_per_token(),
        flops_per_token=2.0 * spec.active_params(), bandwidth=args.bandwidth_gbs * 1e9,
        flops=args.tflops * 1e12, attn_flops_per_pair=2.0 * spec.num_layers * spec.num_heads * per_head)


def _workload(args, trace) -> dict:
    from traffic_profiles import SchedulerConfig, replay
    if not args.model:
        raise _UsageError("--workload needs --model M (an alias such as llama-1b, or a config.json)")
    for name in ("max_num_seqs", "max_num_batched_tokens", "max_points"):
        if getattr(args, name) < 1:
            raise _UsageError(f"--{name.replace('_', '-')} must be at least 1")
    if args.time_scale <= 0 or args.bandwidth_gbs <= 0 or args.tflops <= 0:
        raise _UsageError("--time-scale, --bandwidth-gbs and --tflops must be positive")
    cfg = SchedulerConfig(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                          kv_capacity_tokens=args.kv_capacity_tokens, prefix_caching=not args.no_prefix_caching,
                          time_scale=args.time_scale, max_points=args.max_points)
    out = replay(trace, _step_time(args), cfg).to_dict()
    out["model"] = args.model
    return out


def _profile(args) -> int:
    from traffic_profiles import ProfileConfig, build_profile, read_trace
    from traffic_profiles import rounded_json
    if args.lru_blocks is not None and args.lru_blocks < 1:
        raise _UsageError("--lru-blocks must be at least 1")
    input_file(args.file, "trace")
    if args.out:
        output_file(args.out, "--out")
    trace = read_trace(args.file, block_size=args.block_size)
    profile = build_profile(trace, ProfileConfig(lru_blocks=args.lru_blocks))
    doc = profile.to_dict()
    if args.workload:
        doc["workload"] = rounded_json(_workload(args, trace))
    if args.out:
        profile.save(args.out)
    if args.json:
        print(json.dumps(doc, sort_keys=True))
    else:
        print(_profile_table(doc))
    return 0


def _f(x, digits=4) -> str:
    if x is None:
        return "n/a"
    return f"{x:.{digits}g}" if isinstance(x, float) else str(x)


def _profile_table(d: dict) -> str:
    lines = [f"traffic profile  {d['source']}  ({d['format']}, {d['hash']})",
             f"requests         {d['rows']} over {d['duration_s']:.1f} s, {_f(d['requests_per_s'])} req/s",
             f"{'':16} {'mean':>9} {'p50':>9} {'p90':>9} {'p99':>9} {'max':>9}"]
    for name in ("input_tokens", "output_tokens"):
        s = d[name]
        lines.append(f"{name:16} " + " ".join(f"{_f(s[k], 5):>9}" for k in ("mean", "p50", "p90", "p99", "max")))
    fano = " / ".join(_f(d["fano"].get(k), 3) for k in ("1s", "10s", "60s"))
    lines.append(f"burstiness       inter-arrival CV {_f(d['interarrival_cv'], 3)} (1 = Poisson), "
                 f"Fano 1s/10s/60s {fano}")
    pc = d.get("prefix_cache")
    if pc is None:
        lines.append("prefix cache     n/a (the log has no cached_tokens or hash_ids)")
    else:
        extra = f", LRU {pc['lru_blocks']} blocks: {pc['lru']:.3f}" if "lru" in pc else ""
        lines.append(f"prefix cache     hit rate {d['prefix_cache_hit_rate']:.3f} (from {pc['source']}){extra}")
    s = d.get("sessions")
    if s:
        lines.append(f"sessions         {s['count']} ({s['source']}), {s['mean_turns']:.2f} turns on average, "
                     f"max {s['max_turns']}")
    for group, rows in d.get("groups", {}).items():
        for name, g in rows.items():
            lines.append(f"{group:7} {name[:24]:24} {g['share']:6.1%}  input mean {g['input_mean']:.0f}, "
                         f"output mean {g['output_mean']:.0f}")
    if "workload" in d:
        w, sm = d["workload"], d["workload"]["summary"]
        lines += ["", f"workload points  {w['model']}, max_num_seqs {w['scheduler']['max_num_seqs']}, "
                      f"max_num_batched_tokens {w['scheduler']['max_num_batched_tokens']}: "
                      f"decode {sm['decode_share']:.1%} / prefill {sm['prefill_share']:.1%} of GPU time, "
                      f"mean decode batch {sm['mean_decode_batch']:.1f}",
                  f"{'phase':8} {'batch':>6} {'context':>8} {'chunk':>6} {'weight':>8}"]
        lines += [f"{p['phase']:8} {p['batch']:>6} {p['context']:>8} {p['chunk']:>6} {p['weight']:>8.4f}"
                  for p in w["points"]]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- diff
def _diff(args) -> int:
    from traffic_profiles import DriftThresholds, compare, profile_file
    th = DriftThresholds(**{n: getattr(args, n) for n in DriftThresholds.names()})
    input_file(args.old, "OLD")
    input_file(args.new, "NEW")
    report = compare(profile_file(args.old), profile_file(args.new), th)
    if args.json:
        print(json.dumps(report.to_dict(), sort_keys=True))
    else:
        print(f"{'feature':26} {'old':>10} {'new':>10} {'statistic':>10} {'threshold':>10}  drifted")
        for f in report.features:
            print(f"{f.name:26} {_f(f.old):>10} {_f(f.new):>10} {_f(f.statistic):>10} {f.threshold:>10g}  "
                  f"{'DRIFT' if f.drifted else '-'}")
        verdict = f"drift ({', '.join(report.drifted)})" if report.drift else "no drift"
        print(f"verdict: {verdict}", file=sys.stdout)
    return 1 if report.drift else 0


__all__ = ["register"]
