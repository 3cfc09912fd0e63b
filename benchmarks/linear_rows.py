"""The linear op at every row count a decode step meets, batch 1 to serving batches: cuBLAS against tkcc's linear
templates, timed the fair way.

    python benchmarks/linear_rows.py --device cuda --model llama-1b        # H100/H200: ~6 min, most of it compiling
    python benchmarks/linear_rows.py --device cpu --model tiny-dense --rows 1,17 --configs 1   # the logic (interpreter)

Per projection of the model (qkv, o, gate_up, down, lm_head: ``--shapes``) and per row count (``--rows``), each
variant is captured in a CUDA graph and timed by ``persistent_engine.measure.timing.FairTimer``: ``--steps`` calls
back to back between two events (the headline), and one call after an L2 flush (the median of ``--samples``).
Variants:
- ``cublas``: ``torch.nn.functional.linear``, what eager torch and ``torch.compile``'s default (extern mm) run;
- ``gemv``: ``linear.triton_gemv_splitk``, rows <= 16 (its MAX_M), the best of its settings below;
- ``skinny``: ``linear.triton_skinny`` (swap-AB tensor-core GEMM), the best of its settings below.
A template's settings are picked by the flushed single call (a real step evicts one layer's weights before the
next layer reads its own), then timed both ways; a setting counts only when its output matches the fp32
product within the linear op's tolerance. Bytes are the least the op must move (weights, x, out); GB/s and
the fraction of the measured copy bandwidth (read + write) are from the flushed single call, since back to back
a weight that fits in L2 (llama-1b's o and qkv on an H100's 50 MB) is read from L2, not from memory.
Writes ``benchmarks/results/<gpu>-linear-rows.json`` (``--out``) with GPU, driver, torch, Triton, date.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from agents.templates import Choice, get_template, load_candidate, render_candidate  # noqa: E402
from benchmarks.e2e_decode import copy_bandwidth_gbs, device_info  # noqa: E402
from compiler.plan.artifact import atomic_write_json  # noqa: E402
from persistent_engine.measure import timing  # noqa: E402
from persistent_engine.models.spec import ModelSpec  # noqa: E402
from persistent_engine.ops import registry  # noqa: E402

ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
SHAPES = ("qkv", "o", "gate_up", "down", "lm_head")
GEMV_MAX_ROWS = 16
# (BLOCK_N, BLOCK_K, SPLIT_K, NUM_WARPS, FUSED_REDUCE), best-first guesses for decode GEMVs
GEMV_CONFIGS = ((16, 512, 4, 4, 0), (8, 512, 1, 4, 0), (16, 1024, 4, 4, 1), (32, 256, 2, 4, 0), (8, 1024, 8, 4, 1),
                (16, 256, 1, 2, 0), (4, 512, 4, 4, 1), (32, 512, 8, 8, 1))
# (BLOCK_T, BLOCK_N, BLOCK_K, SPLIT_K, NUM_WARPS, NUM_STAGES, FUSED_REDUCE); BLOCK_T is capped by the rows
SKINNY_CONFIGS = ((64, 64, 128, 4, 4, 4, 0), (64, 128, 128, 2, 4, 4, 0), (64, 64, 128, 8, 4, 4, 1),
                  (64, 128, 64, 4, 4, 5, 1), (128, 64, 128, 2, 4, 4, 0), (128, 128, 64, 1, 8, 4, 0),
                  (64, 64, 256, 2, 4, 3, 1), (32, 64, 128, 4, 4, 4, 0), (256, 64, 64, 1, 8, 3, 0),
                  (64, 32, 128, 8, 4, 4, 1), (128, 128, 128, 2, 8, 3, 1), (16, 64, 256, 4, 4, 3, 0))


class BenchError(ValueError):
    user_error = True


def projections(spec: ModelSpec, names: list[str]) -> dict[str, tuple[int, int]]:
    """{name: (N, K)} of the model's decode projections (weights [N, K])."""
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    table = {"qkv": (q + 2 * kv, spec.hidden_size), "o": (spec.hidden_size, q),
             "gate_up": (2 * spec.intermediate_size, spec.hidden_size),
             "down": (spec.hidden_size, spec.intermediate_size), "lm_head": (spec.vocab_size, spec.hidden_size)}
    unknown = [n for n in names if n not in table]
    if unknown:
        raise BenchError(f"unknown shape(s) {', '.join(unknown)}: choose from {', '.join(SHAPES)}")
    return {n: table[n] for n in names}


def template_impl(name: str, knobs: dict):
    """The template's linear as a candidate would run it (rendered and loaded, defaults under ``knobs``)."""
    t = get_template(name)
    setting = {**t.default(), **knobs}
    problems = t.check(setting)
    if problems:
        return None, problems
    return load_candidate(render_candidate([Choice(t, setting)]))["OVERRIDES"]["linear"], []


def _pow2(n: int) -> int:
    """The least power of two >= n (1 for n <= 1): the row tile a template caps its block to."""
    return 1 << max(n - 1, 0).bit_length()


def gemv_settings(rows: int, count: int) -> list[dict]:
    """The GEMV's settings at ``rows``: row blocks of min(4, pow2(rows)) (the template's largest), so that a W tile
    serves up to 4 rows from registers instead of one row per program re-reading it from L2; BLOCK_K shrinks by
    the row block (the same registers per thread)."""
    if rows > GEMV_MAX_ROWS:
        return []
    bm = min(4, _pow2(rows))
    return [{"GEMV_BLOCK_N": n, "GEMV_BLOCK_K": k // bm, "GEMV_SPLIT_K": s, "GEMV_NUM_WARPS": w, "GEMV_FUSED_REDUCE": f,
             "GEMV_BLOCK_M": bm, "GEMV_MAX_M": GEMV_MAX_ROWS} for n, k, s, w, f in GEMV_CONFIGS[:count]]


def skinny_settings(rows: int, count: int) -> list[dict]:
    """The settings distinct at ``rows`` (a row tile above pow2(rows) is the same kernel as the capped one)."""
    out, seen = [], set()
    cap = max(16, _pow2(rows))
    for t, n, k, s, w, st, f in SKINNY_CONFIGS:
        key = (min(t, cap), n, k, s, w, st, f)
        if key not in seen:
            seen.add(key)
            out.append({"SKINNY_BLOCK_T": t, "SKINNY_BLOCK_N": n, "SKINNY_BLOCK_K": k, "SKINNY_SPLIT_K": s,
                        "SKINNY_NUM_WARPS": w, "SKINNY_NUM_STAGES": st, "SKINNY_FUSED_REDUCE": f,
                        "SKINNY_MAX_M": 512})
    return out[:count]


class Case:
    """One (projection, rows) problem: static inputs, the fp32 product, and a way to time a callable on them."""

    def __init__(self, n: int, k: int, rows: int, dtype: torch.dtype, device: torch.device, timer, a):
        g = torch.Generator(device="cpu").manual_seed(n * 31 + k * 7 + rows)
        self.x = (torch.randn(rows, k, generator=g) * 0.5).to(dtype).to(device)
        self.w = (torch.randn(n, k, generator=g) / k ** 0.5).to(dtype).to(device)
        self.want = torch.nn.functional.linear(self.x.float(), self.w.float())
        self.device, self.timer, self.a = device, timer, a
        self.bytes = (n * k + rows * k + rows * n) * self.x.element_size()

    def matches(self, fn) -> tuple[bool, float]:
        """(every element within the linear op's (atol, rtol) of the fp32 product, the largest difference)."""
        got = fn(self.x, self.w).float()
        atol, rtol = registry.get("linear").tolerances[self.x.dtype]
        diff = (got - self.want).abs()
        ok = bool(torch.isfinite(got).all()) and bool((diff <= atol + rtol * self.want.abs()).all())
        return ok, diff.max().item()

    def runner(self, fn):
        """A zero-argument call of ``fn`` on the case's inputs: a CUDA-graph replay on CUDA, the call on CPU."""
        if self.device.type != "cuda":
            return lambda: fn(self.x, self.w)
        graph, _ = timing.capture_graph(lambda: fn(self.x, self.w), self.device)
        return graph.replay

    def flushed_ms(self, run) -> float:
        run()
        return statistics.median(self.timer.window(run, 1, flush=True)[0] for _ in range(self.a.pick_samples))

    def fair(self, run) -> dict:
        return self.timer.time(run, steps=self.a.steps, samples=self.a.samples).to_dict()


def best_of(case: Case, template: str, settings: list[dict]) -> dict | None:
    """The setting of ``template`` with the least flushed single call among those that match, timed both ways."""
    best, tried, rejected = None, 0, []
    for knobs in settings:
        fn, problems = template_impl(template, knobs)
        if fn is None:
            rejected.append({"knobs": knobs, "why": "; ".join(problems)})
            continue
        ok, err = case.matches(fn)
        if not ok:
            rejected.append({"knobs": knobs, "why": f"output off by {err:.3g}"})
            continue
        run = case.runner(fn)
        tried += 1
        ms = case.flushed_ms(run)
        if best is None or ms < best[0]:
            best = (ms, knobs, run)
    if best is None:
        return {"template": template, "tried": tried, "rejected": rejected, "timing": None}
    return {"template": template, "knobs": best[1], "tried": tried, "rejected": rejected, "timing": case.fair(best[2])}


def measure(case: Case, rows: int, a) -> dict:
    """{variant: {"timing", ...}} for one case: cuBLAS, then the templates' best settings."""
    ok, err = case.matches(torch.nn.functional.linear)
    out = {"cublas": {"timing": case.fair(case.runner(torch.nn.functional.linear)), "max_err": err, "ok": ok}}
    if rows <= GEMV_MAX_ROWS:
        out["gemv"] = best_of(case, "linear.triton_gemv_splitk", gemv_settings(rows, a.configs))
    out["skinny"] = best_of(case, "linear.triton_skinny", skinny_settings(rows, a.configs))
    return out


def row_of(name: str, n: int, k: int, rows: int, case: Case, variants: dict, copy_gbs: float) -> dict:
    base = variants["cublas"]["timing"]
    for v in variants.values():
        t = v.get("timing")
        if t:
            gbs = case.bytes / (t["one_replay_ms"] / 1e3) / 1e9
            v.update(gbs=gbs, copy_fraction=gbs / copy_gbs if copy_gbs else None,
                     vs_cublas_back_to_back=base["back_to_back_ms"] / t["back_to_back_ms"],
                     vs_cublas_one_replay=base["one_replay_ms"] / t["one_replay_ms"])
    return {"shape": name, "N": n, "K": k, "rows": rows, "bytes": case.bytes, "variants": variants}


def print_row(r: dict) -> None:
    cells = []
    for v in ("cublas", "gemv", "skinny"):
        t = r["variants"].get(v, {}).get("timing")
        if t:
            x = r["variants"][v]
            cells.append(f"{v} {t['back_to_back_ms'] * 1e3:7.1f}/{t['one_replay_ms'] * 1e3:7.1f} us "
                         f"{x['copy_fraction'] * 100 if x['copy_fraction'] else 0:5.1f}% "
                         f"x{x['vs_cublas_back_to_back']:.2f}/{x['vs_cublas_one_replay']:.2f}")
    print(f"{r['shape']:>8} N={r['N']:>6} K={r['K']:>5} rows={r['rows']:>3}  " + " | ".join(cells), flush=True)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--model", default="llama-1b")
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated: " + ", ".join(SHAPES))
    p.add_argument("--rows", default=",".join(map(str, ROWS)))
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    p.add_argument("--configs", type=int, default=12, help="settings tried per template and case (at most)")
    p.add_argument("--steps", type=int, default=100, help="calls per back-to-back window")
    p.add_argument("--samples", type=int, default=30, help="flushed single calls per fair timing")
    p.add_argument("--pick-samples", type=int, default=7, help="flushed single calls per setting while picking")
    p.add_argument("--out", default=None, help="results JSON (default benchmarks/results/<gpu>-linear-rows.json)")
    return p


def _ints(text: str, what: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise BenchError(f"--{what} takes comma-separated integers, not {text!r}") from None
    if not vals or min(vals) < 1:
        raise BenchError(f"--{what} takes integers >= 1, not {text!r}")
    return vals


def run(a: argparse.Namespace) -> int:
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BenchError("--device cuda but no GPU is visible")
    for name in ("configs", "steps", "samples", "pick_samples"):
        if getattr(a, name) < 1:
            raise BenchError(f"--{name.replace('_', '-')} must be >= 1")
    rows_list = _ints(a.rows, "rows")
    try:
        spec = ModelSpec.from_name(a.model)
    except Exception as e:  # noqa: BLE001 - an unknown model is a user error
        raise BenchError(f"unknown model {a.model!r}: {e}") from None
    shapes = projections(spec, [s.strip() for s in a.shapes.split(",") if s.strip()])
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[a.dtype]
    info = device_info(device)
    copy_gbs = copy_bandwidth_gbs(device, (1 << 30) if device.type == "cuda" else (64 << 20))
    timer = timing.FairTimer(device)
    print(f"{info['gpu']}: copy bandwidth {copy_gbs:.0f} GB/s; {a.model} {a.dtype}; cells: back to back / one "
          f"flushed replay, % of copy bandwidth (flushed), x cuBLAS (back to back / flushed)", flush=True)
    gpu = info["gpu"].lower().replace("nvidia ", "").split()[0] if device.type == "cuda" else "cpu"
    path = Path(a.out) if a.out else ROOT / "benchmarks" / "results" / f"{gpu}-linear-rows.json"
    out_rows = []
    for name, (n, k) in shapes.items():
        for rows in rows_list:
            case = Case(n, k, rows, dtype, device, timer, a)
            r = row_of(name, n, k, rows, case, measure(case, rows, a), copy_gbs)
            print_row(r)
            out_rows.append(r)
            atomic_write_json(path, results_doc(a, info, copy_gbs, out_rows))    # a cut run keeps its cases
    print(f"wrote {path}")
    return 0


def results_doc(a, info: dict, copy_gbs: float, rows: list[dict]) -> dict:
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return {**info, "date": now, "device": a.device, "model": a.model, "dtype": a.dtype, "copy_bandwidth_gbs": copy_gbs,
            "timer": {"rule": "FairTimer: back_to_back_ms = steps graph replays between two events / steps; "
                              "one_replay_ms = median of single replays after an L2 flush; settings picked by the "
                              "flushed single replay", "steps": a.steps, "samples": a.samples,
                      "pick_samples": a.pick_samples},
            "configs": a.configs, "rows": rows, "summary": summary(rows)}


def summary(rows: list[dict]) -> dict:
    """Per row count: the geometric mean over the shapes of the best template against cuBLAS (flushed)."""
    out = {}
    for rows_n in sorted({r["rows"] for r in rows}):
        ratios = []
        for r in rows:
            if r["rows"] != rows_n:
                continue
            best = [v["vs_cublas_one_replay"] for k, v in r["variants"].items()
                    if k != "cublas" and v.get("timing")]
            if best:
                ratios.append(max(best))
        if ratios:
            out[str(rows_n)] = statistics.geometric_mean(ratios)
    return out


def main(argv: list[str] | None = None) -> int:
    try:
        return run(_parser().parse_args(argv))
    except BenchError as e:
        print(f"linear_rows: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
