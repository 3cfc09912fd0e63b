"""``tkcc bench serve``: replay a trace's arrivals and lengths against an OpenAI-compatible server and
measure TTFT, TPOT, ITL (p50/p90/p99), throughput and goodput under an SLA; and predict the same with
the trace replay model (``traffic_profiles.replay``, which runs the serving engine's own scheduler).

Each request is a streamed ``/v1/completions`` call with a prompt of random token ids (20..249) of the trace's
input length, ``max_tokens`` = its output length, greedy, ``ignore_eos`` (vLLM's extension, honoured
by tkcc serve) so that the output length is the trace's. Prompts are drawn fresh for every run and
every probe (``--seed`` fixes them): a second run on the same server must not find the first run's
prompts in its prefix cache. TTFT = first streamed text; ITL = gaps between streamed chunks;
TPOT = (latency - TTFT) / (output tokens - 1), output tokens from ``usage``.

Prediction: probes fit the server's step time as two forward passes (the serving engine runs the
decodes and the prompt chunks of a step as separate forwards): ``a + b * decode batch + d * their
context tokens`` when anything decodes plus ``p + c * prefill tokens`` when a prompt chunk runs.
``a``/``b``: the TPOT of one and of eight requests decoding together after a short prompt; ``d``: the
TPOT of one after a long prompt; ``p``/``c``: the TTFT of a short and of a long prompt (``p`` holds
the request's HTTP and tokenization cost, which TTFT measures too). Every probe shape
runs once unmeasured first (kernel compiles, autotuning, first allocations) and then three times
(median). The replay with the server's ``max_num_seqs`` / ``max_num_batched_tokens`` (from its
``/v1/models`` when it publishes them) then predicts every request's TTFT and TPOT; the table prints
both and the relative error. What the model leaves out: attention's cost growing with the context
beyond linear (prefill attention), and the host's per-token streaming cost at large batches.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, TextIO

import httpx
import numpy as np


class BenchError(ValueError):
    user_error = True


@dataclass(frozen=True)
class BenchOptions:
    traffic: str
    url: str
    rate: float = 1.0
    max_requests: int = 200
    duration_s: float | None = None
    max_input: int | None = None
    max_output: int | None = None
    ttft_ms: float = 2000.0
    tpot_ms: float = 200.0
    model: str | None = None
    predict: bool = True
    seed: int | None = None           # prompts' token ids; None: fresh ones every run
    timeout_s: float = 600.0


@dataclass(frozen=True)
class RequestResult:
    arrival_s: float
    input_tokens: int
    output_tokens: int
    ttft_s: float | None
    latency_s: float | None
    itl_s: tuple[float, ...]
    error: str | None = None

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.latency_s is None or self.output_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)


@dataclass(frozen=True)
class LinearStepTime:
    """A ``StepTime`` of the serving engine's step, two forwards (seconds): the decode pass
    ``a + b x decoding sequences + d x their context tokens`` when any sequence decodes, plus the
    prefill pass ``p + c x prefill tokens`` when any prompt chunk runs."""

    a: float
    b: float
    c: float
    p: float = 0.0
    d: float = 0.0

    def __call__(self, s) -> float:
        tokens = sum(ch for ch, _ in s.prefill)
        decode = self.a + self.b * s.decode_batch + self.d * s.decode_context if s.decode_batch else 0.0
        return decode + (self.p + self.c * tokens if tokens else 0.0)


def _base(url: str) -> str:
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def _server_info(client: httpx.Client, model: str | None) -> dict:
    try:
        r = client.get("/v1/models")
        r.raise_for_status()
        data = r.json().get("data") or []
    except (httpx.HTTPError, ValueError) as e:
        raise BenchError(f"cannot reach an OpenAI-compatible server at {client.base_url}: {e}") from None
    if not data:
        raise BenchError(f"the server at {client.base_url} lists no models")
    info = next((d for d in data if d.get("id") == model), None) if model else data[0]
    if info is None:
        raise BenchError(f"the server does not serve model {model!r}; it serves {[d.get('id') for d in data]}")
    return info


def _requests(opts: BenchOptions, trace, max_len: int | None) -> list[tuple[float, int, int]]:
    """(arrival s, input tokens, output tokens) of the replayed requests, arrivals divided by the rate."""
    ts = trace.timestamp_s - (trace.timestamp_s[0] if trace.rows else 0.0)
    out = []
    for t, i, o in zip(ts.tolist(), trace.input_tokens.tolist(), trace.output_tokens.tolist()):
        if len(out) >= opts.max_requests or (opts.duration_s is not None and t > opts.duration_s):
            break
        i, o = max(1, int(i)), max(1, int(o))
        if opts.max_input:
            i = min(i, opts.max_input)
        if opts.max_output:
            o = min(o, opts.max_output)
        if max_len:                                          # the server's context: prompt + output
            i = min(i, max_len - 2)
            o = max(1, min(o, max_len - i))
        out.append((t / opts.rate, i, o))
    if not out:
        raise BenchError(f"no requests to replay from {opts.traffic}")
    return out


async def _one(client: httpx.AsyncClient, model: str, arrival: float, t0: float, n_in: int, n_out: int,
               rng: random.Random, timeout: float) -> RequestResult:
    await asyncio.sleep(max(0.0, t0 + arrival - time.perf_counter()))
    body = {"model": model, "prompt": [rng.randrange(20, 250) for _ in range(n_in)], "max_tokens": n_out,
            "temperature": 0.0, "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    first, last, gaps, tokens = None, None, [], None
    try:
        async with client.stream("POST", "/v1/completions", json=body, timeout=timeout) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")[:200]
                return RequestResult(arrival, n_in, n_out, None, None, (), f"HTTP {r.status_code}: {text}")
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    tokens = int(chunk["usage"].get("completion_tokens") or 0)
                if not any(c.get("text") for c in chunk.get("choices") or []):
                    continue
                now = time.perf_counter()
                if first is None:
                    first = now
                else:
                    gaps.append(now - last)
                last = now
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        return RequestResult(arrival, n_in, n_out, None, None, (), f"{type(e).__name__}: {e}")
    end = time.perf_counter()
    return RequestResult(arrival, n_in, tokens if tokens is not None else len(gaps) + (first is not None),
                         None if first is None else first - start, end - start, tuple(gaps))


async def _replay(base: str, model: str, reqs, seed: float, timeout: float, progress: TextIO | None):
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=timeout) as client:
        t0 = time.perf_counter() + 0.05
        tasks = [asyncio.create_task(_one(client, model, a, t0, i, o, rng, timeout)) for a, i, o in reqs]
        done = 0
        for fut in asyncio.as_completed(tasks):
            await fut
            done += 1
            if progress is not None:
                bar = "#" * int(30 * done / len(tasks))
                progress.write(f"\r[tkcc bench] [{bar:<30}] {done}/{len(tasks)} requests")
                progress.flush()
        if progress is not None:
            progress.write("\n")
        wall = time.perf_counter() - t0
        return [t.result() for t in tasks], wall


def _pct(values, qs=(50, 90, 99)) -> dict:
    v = [x for x in values if x is not None]
    if not v:
        return {f"p{q}": None for q in qs} | {"mean": None}
    a = np.asarray(v) * 1e3
    return {f"p{q}": float(np.percentile(a, q)) for q in qs} | {"mean": float(a.mean())}


def calibrate(base: str, model: str, timeout: float, max_len: int | None = None,
              max_batched: int | None = None, seed: int | None = None) -> LinearStepTime:
    """Fits ``LinearStepTime`` from probes (cost: a few seconds): each shape once to warm up, then
    three times, the median kept; every request a fresh prompt (no prefix-cache hits)."""
    rng = random.Random(seed)

    async def probe(batch: int, n_in: int, n_out: int) -> list[RequestResult]:
        async with httpx.AsyncClient(base_url=base, timeout=timeout) as client:
            t0 = time.perf_counter()
            return list(await asyncio.gather(*[_one(client, model, 0.0, t0, n_in, n_out, rng, timeout)
                                               for _ in range(batch)]))

    def measured(batch: int, n_in: int, n_out: int, what: str) -> float:
        values = []
        for rep in range(4):                                     # rep 0: warm-up
            rs = asyncio.run(probe(batch, n_in, n_out))
            bad = [r.error for r in rs if r.error]
            if bad:
                raise BenchError(f"calibration request failed: {bad[0]}")
            v = [getattr(r, what) for r in rs if getattr(r, what) is not None]
            if rep and v:
                values.append(float(np.median(v)))
        return float(np.median(values)) if values else 0.0

    n_short, n_out = 16, 24
    n_long = max(2 * n_short, min(1024, (max_len or 512) // 2, max_batched or 1024))   # one chunk
    t1 = measured(1, n_short, n_out, "tpot_s")
    t8 = measured(8, n_short, n_out, "tpot_s")
    t1_long = measured(1, n_long, n_out, "tpot_s")
    f_short = measured(1, n_short, 1, "ttft_s")
    f_long = measured(1, n_long, 1, "ttft_s")
    ctx = n_short + n_out / 2                                    # mean context while decoding
    d = max(0.0, (t1_long - t1) / (n_long - n_short))
    b = max(0.0, (t8 - t1) / 7 - d * ctx)
    a = max(1e-5, t1 - b - d * ctx)
    c = max(0.0, (f_long - f_short) / (n_long - n_short))
    p = max(0.0, f_short - c * n_short)
    return LinearStepTime(a, b, c, p, d)


def predict(reqs, step: LinearStepTime, info: dict) -> dict:
    """The replay model's TTFT/TPOT for the same requests (the server's scheduler knobs when known)."""
    from traffic_profiles import replay
    from traffic_profiles import SchedulerConfig
    from traffic_profiles import Trace

    arr = np.asarray([a for a, _, _ in reqs], dtype=np.float64)
    trace = Trace(arr - arr[0], np.asarray([i for _, i, _ in reqs], dtype=np.int64),
                  np.asarray([o for _, _, o in reqs], dtype=np.int64), format="synthetic")
    cfg = SchedulerConfig(max_num_seqs=int(info.get("max_num_seqs") or 256),
                          max_num_batched_tokens=int(info.get("max_num_batched_tokens") or 8192),
                          kv_capacity_tokens=info.get("kv_capacity_tokens"), prefix_caching=False)
    s = replay(trace, step, cfg).summary
    ms = lambda v: None if v is None else v * 1e3  # noqa: E731
    return {"ttft_ms": {"p50": ms(s["ttft_p50_s"]), "p99": ms(s["ttft_p99_s"]), "mean": ms(s["ttft_mean_s"])},
            "tpot_ms": {"p50": ms(s["tpot_p50_s"]), "mean": ms(s["tpot_mean_s"])},
            "step_time": asdict(step), "scheduler": {"max_num_seqs": cfg.max_num_seqs,
                                                     "max_num_batched_tokens": cfg.max_num_batched_tokens}}


def _rel(pred: float | None, meas: float | None) -> float | None:
    return None if pred is None or not meas else (pred - meas) / meas


def run_bench(opts: BenchOptions, progress: TextIO | None = None) -> dict:
    from traffic_profiles import read_trace

    if not opts.rate > 0 or opts.max_requests < 1:
        raise BenchError(f"--rate must be > 0 and --max-requests >= 1, not {opts.rate} and {opts.max_requests}")
    trace = read_trace(opts.traffic)
    base = _base(opts.url)
    with httpx.Client(base_url=base, timeout=30) as c:
        info = _server_info(c, opts.model)
    model = info["id"]
    reqs = _requests(opts, trace, info.get("max_model_len"))
    seeds = random.Random(opts.seed)
    step = (calibrate(base, model, opts.timeout_s, info.get("max_model_len"), info.get("max_num_batched_tokens"),
                      seeds.random()) if opts.predict else None)
    results, wall = asyncio.run(_replay(base, model, reqs, seeds.random(), opts.timeout_s, progress))
    ok = [r for r in results if r.error is None]
    out_tokens = sum(r.output_tokens for r in ok)
    good = [r for r in ok if r.ttft_s is not None and r.ttft_s * 1e3 <= opts.ttft_ms
            and (r.tpot_s is None or r.tpot_s * 1e3 <= opts.tpot_ms)]
    res: dict[str, Any] = {
        "url": base, "model": model, "traffic": opts.traffic, "rate": opts.rate, "requests": len(results),
        "completed": len(ok), "failed": len(results) - len(ok), "errors": sorted({r.error for r in results if r.error})[:3],
        "duration_s": wall, "input_tokens": sum(r.input_tokens for r in ok), "output_tokens": out_tokens,
        "output_tokens_per_s": out_tokens / wall if wall > 0 else 0.0,
        "requests_per_s": len(ok) / wall if wall > 0 else 0.0,
        "ttft_ms": _pct(r.ttft_s for r in ok), "tpot_ms": _pct(r.tpot_s for r in ok),
        "itl_ms": _pct(g for r in ok for g in r.itl_s),
        "sla": {"ttft_ms": opts.ttft_ms, "tpot_ms": opts.tpot_ms},
        "goodput_requests_per_s": len(good) / wall if wall > 0 else 0.0,
        "goodput_tokens_per_s": sum(r.output_tokens for r in good) / wall if wall > 0 else 0.0,
        "sla_attainment": len(good) / len(results) if results else 0.0,
    }
    if step is not None:
        p = predict(reqs, step, info)
        p["error"] = {"ttft_p50": _rel(p["ttft_ms"]["p50"], res["ttft_ms"]["p50"]),
                      "ttft_mean": _rel(p["ttft_ms"]["mean"], res["ttft_ms"]["mean"]),
                      "tpot_p50": _rel(p["tpot_ms"]["p50"], res["tpot_ms"]["p50"]),
                      "tpot_mean": _rel(p["tpot_ms"]["mean"], res["tpot_ms"]["mean"])}
        res["predicted"] = p
    return res


def _f(v, spec=".1f") -> str:
    return "-" if v is None else format(v, spec)


def print_table(res: dict, out: TextIO = sys.stdout) -> None:
    w = out.write
    w(f"tkcc bench serve: {res['model']} at {res['url']}, {res['requests']} requests at {res['rate']}x "
      f"({res['completed']} ok, {res['failed']} failed) in {res['duration_s']:.1f} s\n")
    w(f"  throughput  {res['output_tokens_per_s']:.1f} output tokens/s, {res['requests_per_s']:.2f} requests/s\n")
    w(f"  goodput     {res['goodput_tokens_per_s']:.1f} tokens/s, {res['goodput_requests_per_s']:.2f} requests/s "
      f"(SLA TTFT <= {res['sla']['ttft_ms']:.0f} ms, TPOT <= {res['sla']['tpot_ms']:.0f} ms: "
      f"{100 * res['sla_attainment']:.0f}% of requests)\n")
    w(f"  {'ms':<6}{'p50':>10}{'p90':>10}{'p99':>10}{'mean':>10}\n")
    for k in ("ttft_ms", "tpot_ms", "itl_ms"):
        d = res[k]
        w(f"  {k.split('_')[0].upper():<6}{_f(d['p50']):>10}{_f(d['p90']):>10}{_f(d['p99']):>10}{_f(d['mean']):>10}\n")
    p = res.get("predicted")
    if p:
        e = p["error"]
        pct = lambda v: "-" if v is None else f"{100 * v:+.0f}%"  # noqa: E731
        w(f"  replay model: TTFT p50 {_f(p['ttft_ms']['p50'])} ms ({pct(e['ttft_p50'])}), mean "
          f"{_f(p['ttft_ms']['mean'])} ms ({pct(e['ttft_mean'])}); TPOT p50 {_f(p['tpot_ms']['p50'])} ms "
          f"({pct(e['tpot_p50'])}), mean {_f(p['tpot_ms']['mean'])} ms ({pct(e['tpot_mean'])})  "
          f"[error = predicted vs measured]\n")
    if res["errors"]:
        w(f"  errors: {'; '.join(res['errors'])}\n")
