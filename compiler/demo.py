"""``make demo`` (``python -m compiler.demo``): ``tkcc optimize`` on a bundled model with the bundled
Azure conversation trace, a few minutes of search, then where the plan and report are.

    CPU (no GPU visible): tiny-dense, target h200 (projected), measured on this CPU, budget 3m
    GPU:                  llama-1b on the visible GPU, target from its name (h200, h100, b200...)

Environment: TKCC_DEMO_BUDGET (e.g. 90s, 5m), TKCC_DEMO_OUT (default plans/demo).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAFFIC = ROOT / "examples" / "traffic" / "azure2023_conv.csv"
GPU_TARGETS = ("h200", "h100", "b200", "b300", "gb200", "gb300", "mi300x", "mi355x")


def demo_args(has_cuda: bool, gpu_name: str = "") -> list[str]:
    """The ``tkcc optimize`` arguments of the demo on this machine."""
    budget = os.environ.get("TKCC_DEMO_BUDGET", "3m")
    out = os.environ.get("TKCC_DEMO_OUT", str(ROOT / "plans" / "demo"))
    if has_cuda:
        name = gpu_name.lower().replace(" ", "").replace("-", "")
        hw = next((t for t in GPU_TARGETS if t in name), "h200")
        model, device, agents, points = "llama-1b", "cuda", "offline:auto", "4"
        extra = ["--vs-torch-compile"]
    else:
        hw, model, device, agents, points = "h200", "tiny-dense", "cpu", "offline:2", "2"
        extra = []
    return ["optimize", "--model", model, "--hw", hw, "--traffic", str(TRAFFIC), "--budget", budget,
            "--agents", agents, "--device", device, "--max-points", points, "--out", out, *extra]


def main() -> int:
    from compiler.cli import main as tkcc

    try:
        import torch
        has_cuda = torch.cuda.is_available()
        gpu = torch.cuda.get_device_name(0) if has_cuda else ""
    except ImportError:
        has_cuda, gpu = False, ""
    args = demo_args(has_cuda, gpu)
    print("[demo] tkcc " + " ".join(args), flush=True)
    t0 = time.monotonic()
    rc = tkcc(args)
    print(f"[demo] finished in {time.monotonic() - t0:.0f} s (exit {rc})", flush=True)
    if rc == 0:
        out = Path(args[args.index("--out") + 1])
        from compiler.plan import artifact as plan_mod
        plan, vdir = plan_mod.load(out)
        print(f"[demo] plan:   {vdir / 'plan.json'}")
        print(f"[demo] report: {vdir / 'report.md'}")
        print(f"[demo] use it: tkcc plan apply --plan {out}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
