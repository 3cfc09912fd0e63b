"""Where a judged hot-reload cycle spends its time: round trips judge <-> executor, per request kind.

    python benchmarks/judge_breakdown.py                          # tiny-dense on CPU (a minute)
    python benchmarks/judge_breakdown.py --model llama-1b --layers 2 --device cuda

Builds the judge (``judge.engine.Engine``) in this process (candidate code still runs only in its
executors) and wraps, at class level, the judge's side of the wire: ``Executor.call`` (count, wall time and
reply bytes per request ``op``), ``Executor.stop`` / ``cont`` (the SIGSTOP / SIGCONT of an A/B side) and
``contract.reference_outputs`` / ``judge_against`` (the judge's half of an op check). Then it judges
``--cycles`` candidates of ``hot_reload.candidates`` (load + verify + bench + unload, as ``Supervisor.evaluate``
does) and prints, per phase, the wall time split into the executor's round trips by kind, the judge's own
work and the rest. Writes ``benchmarks/results/<device>-judge_breakdown.json`` atomically.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from compiler.plan.artifact import atomic_write_json  # noqa: E402
from hot_reload import candidates  # noqa: E402

PHASES = ("load", "verify", "bench", "unload")


class Probe:
    """Per phase: {kind: [count, seconds, reply bytes]} of everything the wrapped functions did."""

    def __init__(self):
        self.phase = "setup"
        self.rows: dict = collections.defaultdict(lambda: collections.defaultdict(lambda: [0, 0.0, 0]))

    def add(self, kind: str, seconds: float, nbytes: int = 0) -> None:
        row = self.rows[self.phase][kind]
        row[0] += 1
        row[1] += seconds
        row[2] += nbytes

    def install(self) -> None:
        from persistent_engine.executor import launch
        from persistent_engine.judge import checks
        from persistent_engine.ops import contract

        probe = self
        send, receive = launch.Executor.send, launch.Executor.receive
        stop, cont = launch.Executor.stop, launch.Executor.cont

        def timed_send(ex, msg):                # a round trip: from its send to its reply
            ex._probe_sent = (getattr(msg, "KIND", "") or type(msg).__name__, time.perf_counter())   # wire.ExecutorRequest
            return send(ex, msg)

        def timed_receive(ex, timeout_s, what):
            reply = receive(ex, timeout_s, what)
            op, t0 = getattr(ex, "_probe_sent", (what, time.perf_counter()))
            probe.add(f"rpc {op}", time.perf_counter() - t0, _tensor_bytes(reply))
            return reply

        def timed(fn, kind):
            def wrapper(*a, **k):
                t0 = time.perf_counter()
                try:
                    return fn(*a, **k)
                finally:
                    probe.add(kind, time.perf_counter() - t0)
            return wrapper

        launch.Executor.send, launch.Executor.receive = timed_send, timed_receive
        launch.Executor.stop = timed(stop, "SIGSTOP side")
        launch.Executor.cont = timed(cont, "SIGCONT side")
        contract.reference_outputs = timed(contract.reference_outputs, "judge: op references")
        contract.judge_against = timed(contract.judge_against, "judge: op outputs compared")
        checks.spot_check = timed(checks.spot_check, "judge: spot re-check")


def _tensor_bytes(obj) -> int:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    if dataclasses.is_dataclass(obj):           # a typed reply (persistent_engine.executor.wire)
        return sum(_tensor_bytes(getattr(obj, f.name)) for f in dataclasses.fields(obj))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default="tiny-dense")
    ap.add_argument("--layers", default=None, help="N (the first N layers; default: the model's covering set)")
    ap.add_argument("--cycles", type=int, default=6)
    ap.add_argument("--no-bench", action="store_true", help="load, verify, unload only (bench: its own noise)")
    ap.add_argument("--settle-s", type=float, default=120.0, help="wait up to this long for the pool to fill")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if not args.device.startswith("cuda"):
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from persistent_engine import io_struct as io
    from persistent_engine.judge.engine import Engine, EngineConfig

    probe = Probe()
    probe.install()
    layers = list(range(int(args.layers))) if args.layers else None
    t0 = time.perf_counter()
    engine = Engine(EngineConfig(args.model, layers=layers, device=args.device))
    engine.start_pool()
    settle = time.perf_counter()                # steady state, as hot_reload: the pool of warm executors full
    while engine.pool.ready_count() < engine.pool_size and time.perf_counter() - settle < args.settle_s:
        time.sleep(0.5)
    engine.prepare(io.Prepare())                # a warm executor before the first timed cycle
    print(f"judge up in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    per_cycle = []
    try:
        for k, (name, source) in enumerate(candidates(args.cycles, triton=args.device.startswith("cuda"))):
            walls = {}
            for phase, req in zip(PHASES, (io.LoadCandidate(source=source, name=f"c{k}"), io.Verify(),
                                           io.Bench(), io.Unload())):
                if phase == "bench" and args.no_bench:
                    walls[phase] = 0.0
                    continue
                probe.phase = phase
                t = time.perf_counter()
                reply = engine.handle(req)
                walls[phase] = time.perf_counter() - t
                if getattr(reply, "ok", True) is False:
                    print(f"  {name}: {phase} rejected: {reply.reasons}", file=sys.stderr)
            probe.phase = "between"
            engine.prepare(io.Prepare())         # outside the cycle, as the supervisor does
            per_cycle.append(walls)
            print(f"  cycle {k} {name:<26} " + "  ".join(f"{p} {walls[p]:.3f}" for p in PHASES), file=sys.stderr)
    finally:
        engine.close()

    n = len(per_cycle)
    doc = {"benchmark": "judge_breakdown", "device": args.device, "model": args.model, "layers": engine.layers,
           "cycles": n, "phase_median_s": {p: statistics.median(c[p] for c in per_cycle) for p in PHASES},
           "cycle_median_s": statistics.median(sum(c.values()) for c in per_cycle),
           "per_phase": {p: {kind: {"per_cycle": cnt / n, "ms_per_cycle": 1e3 * s / n,
                                    "ms_each": 1e3 * s / max(cnt, 1), "reply_mb_per_cycle": b / n / 1e6}
                             for kind, (cnt, s, b) in sorted(probe.rows[p].items())} for p in PHASES}}
    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / \
        f"{'cuda' if args.device.startswith('cuda') else 'cpu'}-judge_breakdown.json"
    atomic_write_json(out, doc)
    print(f"\njudged cycle breakdown: {args.model} layers {engine.layers} on {args.device}, {n} candidates")
    print(f"{'phase / kind':<36}{'n/cycle':>9}{'ms/cycle':>10}{'ms each':>9}{'MB/cycle':>10}")
    for p in PHASES:
        print(f"{p:<36}{'':>9}{1e3 * doc['phase_median_s'][p]:>10.1f}   (median wall)")
        for kind, r in doc["per_phase"][p].items():
            print(f"  {kind:<34}{r['per_cycle']:>9.1f}{r['ms_per_cycle']:>10.1f}{r['ms_each']:>9.2f}"
                  f"{r['reply_mb_per_cycle']:>10.2f}")
    print(f"{'cycle (median)':<36}{'':>9}{1e3 * doc['cycle_median_s']:>10.1f}   -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
