"""``tkcc serve (--plan DIR | --model M) [--weights PATH] [--host 127.0.0.1] [--port 8000] [--device D] [--tiny]
[--spot-check F] [--mixed-batches | --no-mixed-batches]`` and ``tkcc bench serve --traffic FILE --url URL
[--rate X] [--json]`` (see compiler/serve/openai_app.py and compiler/serve/bench.py)."""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers) -> None:
    p = subparsers.add_parser("serve", help="serve a plan or model behind an OpenAI-compatible HTTP API")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--plan", help="plan directory (root or version); its model, kernels and CONFIG knobs")
    src.add_argument("--model", help="model alias or config.json path (e.g. smollm2-135m: real weights)")
    p.add_argument("--weights", help="GGUF file, or safetensors file/directory with HF names")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda (default auto)")
    p.add_argument("--tiny", action="store_true", help="shrink the model's widths (random weights)")
    p.add_argument("--max-model-len", type=int, default=None, help="tokens per sequence (default 2048 CPU, 4096 GPU)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile the decode forward around the plan's kernels, as the plan was measured "
                        "(default: on for CUDA, off for CPU)")
    p.add_argument("--mixed-batches", action=argparse.BooleanOptionalAction, default=None,
                   help="run a step's prompt chunks and decodes as one ragged forward (default: on when the plan "
                        "overrides attention_prefill with a varlen kernel, off otherwise)")
    p.add_argument("--spot-check", type=float, default=None, metavar="F",
                   help="fraction of each plan override's calls recomputed with the reference in the background "
                        "(default 0.02; 0 disables); a mismatch disables that override")
    p.set_defaults(func=_serve)

    b = subparsers.add_parser("bench", help="benchmarks against a running server")
    bsub = b.add_subparsers(dest="bench_command", metavar="BENCH")
    bsub.required = True
    s = bsub.add_parser("serve", help="replay a trace against an OpenAI-compatible server")
    s.add_argument("--traffic", required=True, help="trace file (parquet, Azure CSV, Mooncake JSONL, BurstGPT CSV)")
    s.add_argument("--url", required=True, help="server base URL (http://host:port, with or without /v1)")
    s.add_argument("--rate", type=float, default=1.0, help="replay X times faster than recorded (default 1)")
    s.add_argument("--max-requests", type=int, default=200, help="first N requests of the trace (default 200)")
    s.add_argument("--duration", type=float, default=None, help="only requests arriving in the first S seconds")
    s.add_argument("--max-input", type=int, default=None, help="clip prompts to this many tokens")
    s.add_argument("--max-output", type=int, default=None, help="clip outputs to this many tokens")
    s.add_argument("--ttft-ms", type=float, default=2000.0, help="SLA on TTFT for goodput (default 2000)")
    s.add_argument("--tpot-ms", type=float, default=200.0, help="SLA on TPOT for goodput (default 200)")
    s.add_argument("--model", default=None, help="model name to request (default: the server's first)")
    s.add_argument("--no-predict", action="store_true", help="skip the replay model's prediction")
    s.add_argument("--seed", type=int, default=None, help="fix the prompts' token ids (default: fresh every run)")
    s.add_argument("--json", action="store_true", help="JSON on stdout")
    s.set_defaults(func=_bench)


def _serve(args) -> int:
    from compiler.serve.openai_app import serve_forever
    from compiler.serve.runtime import ServeOptions, build_runtime
    from compiler.serve.http_server import ServeError

    if not 0 <= args.port <= 65535:
        raise ServeError(f"--port must be 0..65535, not {args.port}")
    if args.spot_check is not None and not 0 <= args.spot_check <= 1:
        raise ServeError(f"--spot-check must be a fraction in [0, 1], not {args.spot_check}")
    if args.max_model_len is not None and args.max_model_len < 2:
        raise ServeError(f"--max-model-len must be >= 2, not {args.max_model_len}")
    from compiler.serve.http_server import bind

    bind(args.host, args.port).close()          # a busy port fails before the model loads
    rt = build_runtime(ServeOptions(model=args.model, plan=args.plan, weights=args.weights, device=args.device,
                                    tiny=args.tiny, max_model_len=args.max_model_len, compile=args.compile,
                                    mixed_batches=args.mixed_batches,
                                    **({} if args.spot_check is None else {"spot_check": args.spot_check})))
    serve_forever(rt, args.host, args.port)
    return 0


def _bench(args) -> int:
    from compiler.serve.bench import BenchOptions, print_table, run_bench

    result = run_bench(BenchOptions(traffic=args.traffic, url=args.url, rate=args.rate, max_requests=args.max_requests,
                                    duration_s=args.duration, max_input=args.max_input, max_output=args.max_output,
                                    ttft_ms=args.ttft_ms, tpot_ms=args.tpot_ms, model=args.model,
                                    predict=not args.no_predict, seed=args.seed), progress=sys.stderr)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)
    return 0
