"""The fast tier's A/A noise while the slow tier's engine starts beside it on the same device (issue 41).

A run's start-up is the slow engine compiling and capturing its step (111-124 s of a 5-minute llama-1b run on the
H100), and only then does the baseline time its A/A rounds. Whether the fast tier's rounds (and the search) may
run during that start-up depends on whether the start-up disturbs what they measure: the fast engine times the
identity candidate (``compiler.search.baseline``: ``linear`` recomputed the reference way, true speedup 1)
before, during and after the slow engine's start-up. One JSON line per evaluation is printed and the whole is
written to ``--out``.

    python benchmarks/aa_noise_during_start.py --device cuda --model llama-1b --slow-layers 8
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from compiler.plan.artifact import atomic_write_json  # noqa: E402
from compiler.search.baseline import _identity_candidate  # noqa: E402
from persistent_engine import Supervisor  # noqa: E402
from persistent_engine.io_struct import WorkloadPoint  # noqa: E402
from persistent_engine.versions import device_name, software_versions  # noqa: E402

POINTS = [WorkloadPoint("decode", 1, 1024), WorkloadPoint("decode", 16, 1024), WorkloadPoint("prefill", 1, 0, 512)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default=None, help="default: llama-1b on cuda, tiny-dense on cpu")
    ap.add_argument("--slow-layers", type=int, default=None, help="default: 8 on cuda, 2 on cpu")
    ap.add_argument("--max-s", type=float, default=330.0, help="stop timing after this many seconds")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    cuda = args.device.startswith("cuda")
    model = args.model or ("llama-1b" if cuda else "tiny-dense")
    layers = args.slow_layers or (8 if cuda else 2)
    t0 = time.monotonic()
    rows: list[dict] = []
    src = _identity_candidate()
    with Supervisor(model, [0], args.device, POINTS) as fast:
        fast_ready = time.monotonic() - t0

        def aa(phase: str) -> None:
            s = time.monotonic()
            v = fast.evaluate(src, 300)
            rows.append({"phase": phase, "speedup": v.speedup, "seconds": round(time.monotonic() - s, 2),
                         "reasons": list(v.reasons[:1]), "at_s": round(time.monotonic() - t0, 1)})
            print(rows[-1], flush=True)

        aa("warm-up")
        aa("before")
        slow = Supervisor(model, list(range(layers)), args.device, POINTS)
        try:
            booting = threading.Thread(target=slow.start, daemon=True)
            s = time.monotonic()
            booting.start()
            while booting.is_alive() and time.monotonic() - t0 < args.max_s:
                aa("during")
            booting.join()
            slow_ready = time.monotonic() - s
            for _ in range(max(3, sum(r["phase"] == "during" for r in rows))):
                if time.monotonic() - t0 > args.max_s:
                    break
                aa("after")
        finally:
            slow.close()
    summary = {}
    for phase in ("during", "after"):
        spread = [abs(r["speedup"] - 1) for r in rows if r["phase"] == phase and r["speedup"]]
        summary[phase] = {"runs": len(spread), "median_spread": round(statistics.median(spread), 4) if spread else None,
                          "max_spread": round(max(spread), 4) if spread else None}
        print(f"{phase:<8} runs {len(spread):>3}  median |speedup - 1| {summary[phase]['median_spread']}  "
              f"max {summary[phase]['max_spread']}")
    doc = {"benchmark": "aa_noise_during_start", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "device": args.device, "device_name": device_name(args.device), **software_versions(cuda),
           "model": model, "slow_layers": layers, "points": [p.to_dict() for p in POINTS],
           "fast_ready_s": round(fast_ready, 1), "slow_ready_s": round(slow_ready, 1), "summary": summary,
           "evaluations": rows, "command": " ".join(["python", "benchmarks/aa_noise_during_start.py", *(argv or sys.argv[1:])])}
    out = Path(args.out or ROOT / "benchmarks" / "results" / f"{'h100' if cuda else 'cpu'}-aa-noise-during-slow-start.json")
    atomic_write_json(out, doc)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
