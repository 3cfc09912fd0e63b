"""The serving engine: continuous batching over the generic decoder, with chunked prefill, a paged KV
cache with prefix caching (``blocks.BlockManager``) and CUDA graphs for decode batch sizes.

    engine = ServingEngine(model, make_scheduler, ServingConfig.from_knobs(plan_config, device="cuda"))
    engine.add("r1", prompt_ids, SamplingParams(max_tokens=64))
    while engine.has_work():
        for ev in engine.step():          # TokenEvent(rid, token, finish_reason)
            ...

The scheduling policy is not defined here: ``make_scheduler(kv_policy)`` returns the scheduler (in
tkcc, ``traffic_profiles.scheduler.Scheduler``, the same one the trace replay runs; injected by the
caller because ``persistent_engine`` imports no sibling package). The engine relies only on the
``SchedulerLike`` protocol below.

One step = the scheduler's plan, run as at most two forward passes over the shared KV pools: the prompt
chunks (ragged, ``attention_prefill``) and the decodes (one token each, ``attention_decode``, replayed
from a CUDA graph captured for the smallest graph batch size that holds them; padded rows write to the
scratch block). With ``mixed_batches`` a step holding both runs them as ONE ragged forward, the decodes as
one-token chunks (the weights streamed once a step, not twice; worth it where ``attention_prefill`` is a
varlen kernel: the reference's cost grows with the batch's sequence count). Every op goes through the
registry, so a plan's overrides (installed by the caller) run here; its CONFIG knobs come in through
``ServingConfig.from_knobs``.
Host syncs: one per forward (reading the sampled tokens).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Protocol

import torch

from persistent_engine.models.kv_cache import KVCache, alloc_kv_cache
from persistent_engine.models.spec import SpecError
from persistent_engine.ops.opdef import DEFAULT_BLOCK_SIZE
from persistent_engine.serving.blocks import SCRATCH_BLOCK, BlockManager
from persistent_engine.serving.sampling import SamplingParams, sample_rows
from persistent_engine.inputs.workloads import Workload

__all__ = ["ServingConfig", "ServingEngine", "TokenEvent", "SchedulerLike", "KNOBS", "compiled_decode", "compile_count"]

# CONFIG keys of a plan the serving engine consumes (DESIGN.md "Candidate")
KNOBS = ("max_num_seqs", "max_num_batched_tokens", "cuda_graph_batch_sizes", "kv_block_size")


class SchedulerLike(Protocol):
    """What the engine needs of a scheduler (``traffic_profiles.scheduler.Scheduler`` is one):
    ``submit`` queues a request and returns its sequence (with ``rid``, ``prompt_len``, ``computed``,
    ``out_left``); ``schedule`` returns a plan (``decodes``, ``chunks`` of (seq, tokens), ``rejected``);
    ``advance(plan)`` books it and returns (first-token seqs, finished seqs, KV released); ``finish``
    removes a sequence early; ``waiting``/``running`` are its queues."""

    waiting: Any
    running: Any

    def submit(self, rid: Any, prompt_len: int, max_new: int, arrival: float = 0.0) -> Any: ...

    def schedule(self) -> Any: ...

    def advance(self, plan: Any, decode_steps: int = 1) -> tuple[list, list]: ...

    def finish(self, seq: Any) -> None: ...

    def has_work(self) -> bool: ...


@dataclass(frozen=True)
class ServingConfig:
    device: str = "cpu"
    dtype: torch.dtype = torch.float32
    block_size: int = DEFAULT_BLOCK_SIZE
    max_model_len: int = 2048
    kv_cache_bytes: int = 256 << 20          # bytes of K/V pools, all layers
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    cuda_graph_batch_sizes: tuple[int, ...] = ()     # decode batch sizes captured (CUDA only)
    prefix_caching: bool = True
    compile: bool = False                    # torch.compile the decode forward (before graph capture)
    compile_backend: str = "inductor"        # torch.compile's backend ("eager": dynamo only, the CPU test's)
    mixed_batches: bool = False              # prompt chunks and decodes of a step in one ragged forward

    @classmethod
    def from_knobs(cls, knobs: dict, **kw) -> "ServingConfig":
        """An engine config from a plan's CONFIG (keys of ``KNOBS``; others are not the engine's)
        over the keyword defaults."""
        kw = dict(kw)
        if "kv_block_size" in knobs:
            kw["block_size"] = int(knobs["kv_block_size"])
        for k in ("max_num_seqs", "max_num_batched_tokens"):
            if k in knobs:
                kw[k] = int(knobs[k])
        if "cuda_graph_batch_sizes" in knobs:
            kw["cuda_graph_batch_sizes"] = tuple(sorted(int(b) for b in knobs["cuda_graph_batch_sizes"]))
        return cls(**kw)


@dataclass(frozen=True)
class TokenEvent:
    rid: Any
    token: int | None                   # None: finished without a token (rejected, aborted)
    finish_reason: str | None = None    # "length" | "stop" | "abort" | "rejected"


@dataclass
class _Request:
    rid: Any
    prompt: list[int]
    params: SamplingParams
    seq: Any
    output: list[int] = field(default_factory=list)


class ServingEngine:
    def __init__(self, model, make_scheduler: Callable[[BlockManager], SchedulerLike], cfg: ServingConfig,
                 progress: Callable[[str], None] | None = None,
                 decode_context: Callable[[int], ContextManager] | None = None):
        """``progress``: called with a line per CUDA-graph capture (size, width, seconds, replay ms, compiles so far).
        ``decode_context(b)``: entered around the decode forward of batch size b (its graph's capture, an eager
        decode): a plan's per-bucket overrides (``compiler.plan.buckets``); none by default."""
        self.model, self.cfg = model, cfg
        self.decode_context = decode_context or (lambda _b: contextlib.nullcontext())
        if model.spec.attention == "v4":
            raise SpecError(f"{model.spec.name}: serving DeepSeek-V4 is not implemented yet (its compressed entries are "
                            "kept per sequence, not in the paged pools); tkcc optimize / candidate check run it")
        bs = cfg.block_size
        per_block = bs * model.spec.kv_bytes_per_token_layer("fp32" if cfg.dtype == torch.float32 else "bf16")
        num_blocks = max(2, int(cfg.kv_cache_bytes // max(1.0, per_block * len(model.layers))))
        self.max_blocks = -(-cfg.max_model_len // bs)
        self.kv = BlockManager(num_blocks, bs, self.max_blocks, cfg.prefix_caching)
        pools = alloc_kv_cache(model.spec, model.layers, 1, num_blocks * bs, device=cfg.device, dtype=cfg.dtype,
                               block_size=bs, fill="zeros")
        self.pools_k, self.pools_v, self.pools_index = pools.k, pools.v, pools.index_k   # index_k: M3's index keys
        self.scheduler = make_scheduler(self.kv)
        self.requests: dict[Any, _Request] = {}
        self.steps = 0
        self.decode_fn = compiled_decode(model.step, cfg.compile_backend) if cfg.compile else model.step
        self.graphs = _DecodeGraphs(self, progress) if cfg.cuda_graph_batch_sizes else None

    # ------------------------------------------------------------- requests
    def add(self, rid: Any, prompt: list[int], params: SamplingParams, arrival: float | None = None) -> None:
        """Queues a request; its prompt plus ``max_tokens`` must fit ``max_model_len`` (checked by the caller)."""
        self.kv.expect(rid, prompt)
        seq = self.scheduler.submit(rid, len(prompt), params.max_tokens, time.monotonic() if arrival is None else arrival)
        self.requests[rid] = _Request(rid, list(prompt), params, seq)

    def abort(self, rid: Any) -> None:
        req = self.requests.pop(rid, None)
        if req is not None:
            self.scheduler.finish(req.seq)
            self.kv.forget(rid)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    # ------------------------------------------------------------- one step
    @torch.no_grad()
    def step(self) -> list[TokenEvent]:
        plan = self.scheduler.schedule()
        events = [TokenEvent(s.rid, None, "rejected") for s in plan.rejected]
        for s in plan.rejected:
            self.requests.pop(s.rid, None)
            self.kv.forget(s.rid)
        sampled: dict[Any, int] = {}
        if plan.chunks and plan.decodes and self.cfg.mixed_batches:
            sampled.update(self._ragged(plan.chunks, plan.decodes))
        else:
            if plan.chunks:
                sampled.update(self._ragged(plan.chunks))
            if plan.decodes:
                sampled.update(self._decode(plan.decodes))
        _, done = self.scheduler.advance(plan)
        finished = {s.rid for s in done}
        for s, _c in plan.chunks:
            if s.rid in self.requests and s.rid not in finished:
                self.kv.commit(s.rid, s.computed)
        for rid, tok in sampled.items():
            req = self.requests[rid]
            req.output.append(tok)
            reason = None
            if tok in req.params.stop_token_ids:
                reason = "stop"
                if rid not in finished:
                    self.scheduler.finish(req.seq)
            elif rid in finished:
                reason = "length"
            if reason:
                del self.requests[rid]
            events.append(TokenEvent(rid, tok, reason))
        self.steps += 1
        return events

    def _workload(self, phase: str, ids, pos, slots, tables, ctx, cu, last) -> Workload:
        dev = self.cfg.device
        t = lambda x, dt: torch.tensor(x, dtype=dt, device=dev)  # noqa: E731
        cache = KVCache(self.cfg.block_size, t(tables, torch.int32), self.pools_k, self.pools_v, self.pools_index)
        return Workload(phase, len(ctx), 0, 1, t(ids, torch.int64), t(pos, torch.int64), t(slots, torch.int64),
                        t(ctx, torch.int32), t(cu, torch.int32), t(last, torch.int64), cache)

    def _tables(self, rids, width: int) -> list[list[int]]:
        return [(self.kv.tables[r] + [SCRATCH_BLOCK] * width)[:width] for r in rids]

    def _ragged(self, chunks, decodes=()) -> dict[Any, int]:
        """One ragged forward over the prompt chunks and (a mixed batch) the decodes as one-token chunks after
        them; samples for the decodes and for the sequences whose prompt ends here."""
        ids, pos, slots, ctx, cu, last = [], [], [], [], [0], []
        tokens = [self.requests[s.rid].prompt[s.computed:s.computed + c] for s, c in chunks]
        tokens += [self.requests[s.rid].output[-1:] for s in decodes]
        for (s, c), toks in zip([*chunks, *((s, 1) for s in decodes)], tokens):
            p0 = s.computed
            ids += toks
            pos += range(p0, p0 + c)
            slots += [self.kv.slot(s.rid, p) for p in range(p0, p0 + c)]
            ctx.append(p0 + c)
            cu.append(cu[-1] + c)
            last.append(cu[-1] - 1)
        rids = [s.rid for s, _ in chunks] + [s.rid for s in decodes]
        width = max(self.kv.blocks_for(n) for n in ctx)
        wl = self._workload("prefill", ids, pos, slots, self._tables(rids, width), ctx, cu, last)
        logits = self.model.step(wl)                                   # [sequences, V]: each one's last token
        rows = [i for i, (s, c) in enumerate(chunks) if s.prefill_left == c]      # prompt done: first token
        rows += range(len(chunks), len(chunks) + len(decodes))
        seqs = [chunks[i][0] if i < len(chunks) else decodes[i - len(chunks)] for i in rows]
        return self._sample(seqs, logits[rows] if rows else logits[:0])

    def _decode(self, decodes) -> dict[Any, int]:
        rids = [s.rid for s in decodes]
        ids = [self.requests[r].output[-1] for r in rids]
        pos = [s.computed for s in decodes]
        slots = [self.kv.slot(r, p) for r, p in zip(rids, pos)]
        ctx = [p + 1 for p in pos]
        if self.graphs is not None and self.graphs.fits(len(rids)):
            logits = self.graphs.run(ids, pos, slots, [self.kv.tables[r] for r in rids], ctx)
        else:
            width = max(self.kv.blocks_for(n) for n in ctx)
            wl = self._workload("decode", ids, pos, slots, self._tables(rids, width), ctx,
                                list(range(len(ids) + 1)), list(range(len(ids))))
            with self.decode_context(len(rids)):
                logits = self.decode_fn(wl)
        return self._sample(decodes, logits)

    def _sample(self, seqs, logits: torch.Tensor) -> dict[Any, int]:
        if not seqs:
            return {}
        reqs = [self.requests[s.rid] for s in seqs]
        toks = sample_rows(logits, [r.params for r in reqs], [len(r.output) for r in reqs])
        return {r.rid: t for r, t in zip(reqs, toks)}

    # ------------------------------------------------------------- figures
    def stats(self) -> dict:
        return {"waiting": len(self.scheduler.waiting), "running": len(self.scheduler.running),
                "kv_usage": self.kv.usage, "kv_blocks": self.kv.num_blocks - 1,
                "prefix_hit_tokens": self.kv.hit_tokens, "prompt_tokens": self.kv.prompt_tokens,
                "steps": self.steps}


def compile_count() -> int:
    """Graphs torch.compile (dynamo) has compiled in this process so far (recompiles included)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _mark_decode_dims(wl: Workload) -> None:
    """Marks what varies between decode steps as dynamic: the batch (dim 0 of every per-token and
    per-sequence tensor) and the block-table width. Everything else (weights, KV pools, cos/sin cache)
    keeps its static shape. ``maybe_``: a size of 1 is specialised (one more compile), not an error."""
    for t in (wl.token_ids, wl.positions, wl.slot_mapping, wl.context_lens, wl.cu_seqlens_q, wl.last_token_index):
        torch._dynamo.maybe_mark_dynamic(t, 0)
    torch._dynamo.maybe_mark_dynamic(wl.cache.block_tables, 0)
    torch._dynamo.maybe_mark_dynamic(wl.cache.block_tables, 1)


def compiled_decode(step: Callable[[Workload], torch.Tensor], backend: str = "inductor") -> Callable:
    """``step`` (the decode forward) under ``torch.compile`` as a serving engine compiles it (vLLM marks
    its token dimension dynamic the same way): one graph for every batch size >= 2 and every block-table
    width >= 2, the weights' shapes static. ``torch.compile(step, dynamic=True)`` instead makes every
    tensor dimension symbolic, the weights' too, and duck sizing then ties a batch size to an equal weight
    or pool dimension (tiny-dense: batch 128 == its qkv rows) so another batch size recompiles; it also
    compiles weight-generic kernels. Duck sizing is off while compiling so that an equal batch size and
    width at the first call do not tie those two either. Compiles: 1, plus one per size-1 case met
    (a batch of 1, a table 1 block wide: at most 4 in all)."""
    from torch.fx.experimental import _config as fx_config

    fn = torch.compile(step, backend=backend)

    def run(wl: Workload) -> torch.Tensor:
        _mark_decode_dims(wl)
        with fx_config.patch(use_duck_shape=False):
            return fn(wl)

    return run


def _replay_ms(g: "torch.cuda.CUDAGraph") -> float:
    """Device time of one replay of ``g`` after a warm one (CUDA events; < 1 s for all 32 graphs). The
    graph's static buffers write their K/V to the scratch block, so replaying it changes no sequence."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    g.replay()
    start.record()
    g.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


class _DecodeGraphs:
    """CUDA graphs of the decode forward, one per (batch size of ``cuda_graph_batch_sizes``, block-table
    width), over static input buffers. Widths are 1/8, 1/4, 1/2 and all of ``max_blocks``: attention
    reads every column of the table it is given, so short contexts replay a narrow graph. Captured
    largest first in one memory pool; cost: sizes x 4 captures at start-up. On CPU nothing is captured:
    ``run`` calls the forward on the same static, padded buffers (the CPU test of this logic)."""

    def __init__(self, engine: ServingEngine, progress: Callable[[str], None] | None = None):
        self.engine = engine
        self.sizes = sorted(engine.cfg.cuda_graph_batch_sizes)
        mb = engine.max_blocks
        self.widths = sorted({max(1, mb // d) for d in (8, 4, 2, 1)})
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph | None, Workload, torch.Tensor | None]] = {}
        self.rows = self.padded_rows = 0        # decode rows replayed: real ones, padding
        self.replay_ms: dict[tuple[int, int], float] = {}   # one replay's device time per graph (CUDA only)
        capture = engine.cfg.device != "cpu"
        pool = torch.cuda.graph_pool_handle() if capture else None
        for b in reversed(self.sizes):
            for w in reversed(self.widths):
                t0 = time.perf_counter()
                wl = engine._workload("decode", [0] * b, [0] * b, [0] * b, [[SCRATCH_BLOCK] * w] * b,
                                      [1] * b, list(range(b + 1)), list(range(b)))
                if not capture:
                    self.graphs[(b, w)] = (None, wl, None)
                    continue
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream), engine.decode_context(b):
                    for _ in range(2):                              # warm-up (and compile) off the graph
                        engine.decode_fn(wl)
                torch.cuda.current_stream().wait_stream(stream)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=pool), engine.decode_context(b):
                    out = engine.decode_fn(wl)
                self.graphs[(b, w)] = (g, wl, out)
                self.replay_ms[(b, w)] = _replay_ms(g)
                if progress is not None:
                    progress(f"decode graph {len(self.graphs)}/{len(self.sizes) * len(self.widths)}: batch {b}, "
                             f"width {w} blocks, {time.perf_counter() - t0:.1f} s, replay "
                             f"{self.replay_ms[(b, w)]:.3f} ms ({compile_count()} compiles so far)")

    def fits(self, batch: int) -> bool:
        return bool(self.sizes) and batch <= self.sizes[-1]

    def pick(self, batch: int, blocks: int) -> tuple[int, int]:
        """The graph a decode of ``batch`` sequences needing ``blocks`` table columns replays: the
        smallest captured size and width that hold it. Its cost grows with the padded size (attention
        reads every row and column), so sparse sizes (2, 16, 128) make a batch of 3 pay for 16."""
        return next(s for s in self.sizes if s >= batch), next(x for x in self.widths if x >= blocks)

    def run(self, ids, pos, slots, tables, ctx) -> torch.Tensor:
        """Logits [n, V] of one decode step of n sequences (``tables``: their block lists, any length)."""
        n = len(ids)
        b, w = self.pick(n, max(self.engine.kv.blocks_for(c) for c in ctx))
        self.rows += n
        self.padded_rows += b - n
        g, wl, out = self.graphs[(b, w)]
        pad = b - n
        rows = [(t + [SCRATCH_BLOCK] * w)[:w] for t in tables] + [[SCRATCH_BLOCK] * w] * pad
        wl.token_ids.copy_(torch.tensor(ids + [0] * pad), non_blocking=True)
        wl.positions.copy_(torch.tensor(pos + [0] * pad), non_blocking=True)
        wl.slot_mapping.copy_(torch.tensor(slots + [0] * pad), non_blocking=True)
        wl.context_lens.copy_(torch.tensor(ctx + [1] * pad, dtype=torch.int32), non_blocking=True)
        wl.cache.block_tables.copy_(torch.tensor(rows, dtype=torch.int32), non_blocking=True)
        if g is None:
            with self.engine.decode_context(b):
                return self.engine.decode_fn(wl)[:n]
        g.replay()
        return out[:n]
