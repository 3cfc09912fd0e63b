"""``python -m persistent_engine serve``: build one engine and serve it over RPC until shut down.

stdout carries JSON lines only: one ``{"stage": name, "seconds": s}`` per start-up stage (process,
imports, weights, kv_cache, warmup, calibration, graph_capture), then ``{"ready": true, "port", "address",
"token_file", "pid", "startup"}``. A bad argument prints ``{"ready": false, "error": ...}`` and one
line on stderr, exit 2. Exit 3: the engine left because a device error poisoned its CUDA context
or a candidate left a thread behind (the supervisor starts a fresh one).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from persistent_engine.io_struct import WorkloadPoint

T_MAIN = time.time()
PARENT_ENV = "TKCC_ENGINE_PARENT_PID"       # set by the supervisor: leave when that process is gone
SPAWNED_ENV = "TKCC_ENGINE_SPAWNED_AT"      # set by the supervisor: time.time() of the spawn


def _process_age() -> float:
    """Seconds since the kernel started this process (10 ms resolution), read from /proc."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


PROCESS_S = _process_age()                  # interpreter start-up, up to this module running


def _process_seconds() -> float:
    """The ``process`` stage: from the supervisor's spawn call (its clock, passed in the
    environment) when there is one, else from the kernel starting this process."""
    spawned = os.environ.get(SPAWNED_ENV)
    try:
        return max(0.0, T_MAIN - float(spawned)) if spawned else PROCESS_S
    except ValueError:
        return PROCESS_S


def _emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def parse_layers(text: str | None):
    """``N`` -> the first N layers; ``i,j,k`` -> those indices; None -> the fast tier's covering set."""
    if text is None or text == "":
        return None
    try:
        if "," in text:
            return [int(x) for x in text.split(",") if x.strip()]
        n = int(text)
    except ValueError:
        raise ValueError(f"--layers must be N or i,j,k, got {text!r}") from None
    if n < 1:
        raise ValueError("--layers must be at least 1")
    return list(range(n))


def parse_points(text: str | None) -> list[WorkloadPoint]:
    """``--points``: a JSON list of point maps (or a file holding one), the CLI's boundary."""
    from persistent_engine.io_struct import WorkloadPoint

    if not text:
        return []
    raw = open(text).read() if os.path.exists(text) else text
    try:
        points = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"--points is not JSON: {e}") from None
    if not isinstance(points, list) or not all(isinstance(p, dict) and "phase" in p and "batch" in p
                                               for p in points):
        raise ValueError("--points must be a JSON list of workload point objects")
    try:
        return [WorkloadPoint.from_dict(p) for p in points]
    except (TypeError, ValueError) as e:
        raise ValueError(f"--points has a bad workload point: {e}") from None


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m persistent_engine")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="build the engine once and serve candidates over RPC")
    s.add_argument("--model", required=True)
    s.add_argument("--layers", default=None, help="N (first N layers) or i,j,k; default: covering layers")
    s.add_argument("--device", default="cpu")
    s.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=0)
    s.add_argument("--allow-remote", action="store_true", help="allow a non-loopback bind")
    s.add_argument("--token-file", default=None, help="where to write the token (0600)")
    s.add_argument("--points", default=None, help="workload points: JSON list or a file holding one")
    s.add_argument("--variants", type=int, default=2)
    s.add_argument("--no-cuda-graph", action="store_true")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--inputs", default=None, help="the tier's input realism (tier_inputs.py): JSON or a file")
    s.add_argument("--co-tenant-weights", type=int, default=0,
                   help="bytes of weights other engines on this device hold or will hold (judge/memory.py)")
    return ap


def parse_inputs(text: str | None) -> dict:
    if not text:
        return {}
    raw = open(text).read() if os.path.exists(text) else text
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"--inputs is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ValueError("--inputs must be a JSON object")
    return doc


def serve(args) -> int:
    from persistent_engine.server import (TOKEN_ENV, EngineServer, ServerConfig, make_token,
                                          write_token_file)

    from persistent_engine.lifeline import watch_parent
    watch_parent()                              # first thing: a kill of the orchestrator ends this engine too
    _emit({"stage": "process", "seconds": round(_process_seconds(), 4)})
    layers, points, inputs = parse_layers(args.layers), parse_points(args.points), parse_inputs(args.inputs)
    token = os.environ.get(TOKEN_ENV) or make_token()
    server = EngineServer(token, ServerConfig(host=args.host, port=args.port, allow_remote=args.allow_remote))
    token_file = None
    if args.token_file or not os.environ.get(TOKEN_ENV):
        token_file = write_token_file(token, args.token_file)

    if args.device == "cpu":                    # Triton kernels of candidates run interpreted on CPU
        os.environ.setdefault("TRITON_INTERPRET", "1")
    t0 = time.perf_counter()
    import torch  # noqa: F401 - timed: the imports stage
    import triton  # noqa: F401

    from persistent_engine.measure import timing  # noqa: F401 - binds the clocks before any candidate
    from persistent_engine.judge.engine import Engine, EngineConfig
    from persistent_engine.models.spec import ModelSpec
    imports_s = time.perf_counter() - t0
    _emit({"stage": "imports", "seconds": round(imports_s, 4)})

    if layers is None:
        layers = ModelSpec.from_name(args.model).covering_layers()
    engine = Engine(EngineConfig(model=args.model, layers=layers, device=args.device, dtype=args.dtype,
                                 points=points, seed=args.seed, variants=args.variants,
                                 cuda_graph=not args.no_cuda_graph, inputs=inputs,
                                 co_tenant_weights=max(0, args.co_tenant_weights)),
                    log=lambda name, s: _emit({"stage": name, "seconds": round(s, 4)}))
    engine.start_pool()                         # warm candidate executors start now, in the background
    startup = {"process": round(_process_seconds(), 4), "imports": round(imports_s, 4), **engine.startup}
    engine.startup = startup                    # status replies carry the whole table
    _emit({"ready": True, "port": server.port, "address": server.address, "token_file": token_file,
           "pid": os.getpid(), "startup": startup, "layers": engine.layers,
           "logit_noise": engine.logit_noise, "logit_tol": engine.logit_tol, "inputs": engine.inputs.to_dict(),
           "routing": engine.routing})
    parent = int(os.environ.get(PARENT_ENV, "0") or 0)
    try:
        server.serve(engine.handle, after_reply=lambda reply: engine.poisoned,
                     keep_going=(lambda: os.getppid() == parent) if parent else None)
    finally:
        engine.close()                          # every executor, with its process group
    if token_file and not args.token_file:
        try:
            os.unlink(token_file)
        except OSError:
            pass
    return 3 if engine.poisoned else 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return serve(args)
    except Exception as e:  # noqa: BLE001 - one line, never a traceback
        if os.environ.get("TKCC_DEBUG"):
            raise
        code = 2 if getattr(e, "user_error", False) or isinstance(e, (ValueError, OSError)) else 3
        _emit({"ready": False, "error": f"{type(e).__name__}: {e}"})
        print(f"persistent_engine: error: {e}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
