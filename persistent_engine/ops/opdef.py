"""``OpDef``: what the registry knows about one op, and the helpers the op modules share.

An op is a function of tensors and Python scalars that returns new tensors and modifies none of its
inputs, except its *declared in-place outputs* (``writes``: ``SlotWrite(pool, slots)``, e.g. the new tokens'
K/V rows of the paged cache): it writes exactly the rows ``args[slots]`` of the pool ``args[pool]`` (a
tensor, or a tuple of tensors each written at those rows) and leaves every other row bitwise unchanged.
The contract checks those rows as outputs and the rest as inputs (``contract.run_candidate``). Its ``reference`` is plain PyTorch (the ``native`` path). ``make_inputs(shape, dtype,
device, seed)`` draws a fresh positional-argument tuple from its own ``torch.Generator`` (never the
global RNG); ``shape`` is one of the dicts that ``shapes(spec, point)`` returns for a model spec and a
workload point, or one of ``examples`` (small shapes with odd sizes, for contract tests).

A *composite* op is a fusion of finer ops that the model calls as one (e.g. ``add_rms_norm_linear`` =
``fused_add_rms_norm`` then ``linear``). Its ``reference`` is the plain composition of the fine ops'
references (what verification compares against); its ``default`` is the same composition dispatched
through ``registry.call``, which the registry runs when the composite is not overridden, so an override
of a fine op still reaches the call sites inside the composite. Overriding the composite itself
replaces the whole fusion (one kernel instead of several). A *region* is a composite the size of a
decoder layer or of the whole decode step (``ops/layers.py``): the same rules, the weights passed as
arguments like any composite's; the profiler looks through a region that runs its default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from persistent_engine.io_struct import WorkloadPoint

# (atol, rtol) by dtype for elementwise-ish ops; ops with long reductions pass their own table.
DEFAULT_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-4, 1e-4),
    torch.float16: (5e-3, 5e-3),
    torch.bfloat16: (2e-2, 2e-2),
}
MATMUL_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (2e-4, 2e-4),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (4e-2, 3e-2),
}

DEFAULT_BLOCK_SIZE = 16     # KV cache block size (tokens) when a workload point does not say


@dataclass(frozen=True)
class SlotWrite:
    """A declared in-place output: the op writes rows ``args[slots]`` (int64 [T], flat slot = block * BS +
    offset; distinct) of the paged pool ``args[pool]`` ([NB, BS, ...], viewed as [NB * BS, ...]; or a tuple of
    such pools, each written at the same rows) and nothing else of it."""
    pool: int                                        # positional index of the pool argument
    slots: int                                       # positional index of the slot-mapping argument


@dataclass(frozen=True)
class OpDef:
    name: str
    reference: Callable[..., Any]
    signature: str                                   # documented shapes, dtypes and semantics
    make_inputs: Callable[[dict, torch.dtype, Any, int], tuple]
    shapes: Callable[[Any, WorkloadPoint], list[dict]]   # (ModelSpec, workload point) -> shape dicts
    examples: tuple[dict, ...]                       # small shapes (odd sizes) for contract tests
    outputs: int = 1                                 # number of returned tensors (1: a bare tensor)
    tolerances: dict = field(default_factory=lambda: dict(DEFAULT_TOLERANCES))
    # maps the outputs to a form where equal results compare equal (e.g. top-k in id order)
    canonicalize: Callable[[tuple], tuple] | None = None
    # composite ops: what registry.call runs when the op is not overridden (None: the reference)
    default: Callable[..., Any] | None = None
    # (shape, budget bytes) -> a smaller shape of the same op whose op-level check fits the budget (None:
    # always checked at full size); layer-level verification still runs the op at the model's shapes
    fit: Callable[[dict, int], dict] | None = None
    # shape -> bytes an op-level check at that shape holds (both halves); with ``fit``, what the judge keeps
    # free for the check at its smallest shape (``judge/memory.py``); None: small enough to ignore
    check_bytes: Callable[[dict], int] | None = None
    # declared in-place outputs (checked after the returned ones, in this order; see ``SlotWrite``)
    writes: tuple[SlotWrite, ...] = ()
    # a region (``ops/layers.py``: a layer, the step, the K/V write around the qkv composite): the profiler
    # attributes its time to its parts while it runs its default (profiles keep the fine ops' names, each
    # entry naming the regions it ran inside in "regions")
    region: bool = False

    @property
    def composite(self) -> bool:
        return self.default is not None

    @property
    def baseline(self) -> Callable[..., Any]:
        """What ``registry.call`` runs when nothing overrides this op: ``default`` or ``reference``."""
        return self.default or self.reference

    def tolerance(self, dtype: torch.dtype) -> tuple[float, float]:
        return self.tolerances.get(dtype, self.tolerances[torch.float32])


# ----------------------------------------------------------------------------- input helpers
def generator(device: Any, seed: int) -> torch.Generator:
    g = torch.Generator(device=torch.device(device))
    g.manual_seed(int(seed))
    return g


def randn(g: torch.Generator, shape, dtype, device, std: float = 1.0) -> torch.Tensor:
    t = torch.randn(tuple(shape), generator=g, device=device, dtype=torch.float32)
    return (t * std).to(dtype)


def randint(g: torch.Generator, high: int, shape, device, dtype=torch.int64) -> torch.Tensor:
    return torch.randint(0, int(high), tuple(shape), generator=g, device=device, dtype=dtype)


def new_tokens(point: WorkloadPoint) -> int:
    """New tokens per sequence at a workload point: 1 for decode, the chunk for prefill."""
    return 1 if point.phase == "decode" else max(int(point.chunk), 1)


def tokens(point: WorkloadPoint) -> int:
    """Tokens in flight at a workload point: batch x new tokens per sequence."""
    return int(point.batch) * new_tokens(point)


def seq_shape(point: WorkloadPoint, chunk_always: bool = False) -> dict:
    """The per-sequence part of an op's shape dict at a point: ``B`` sequences and, for prefill (or
    ``chunk_always``), ``chunk`` new tokens per sequence (recurrent ops: no KV cache)."""
    return {"B": int(point.batch), **({"chunk": new_tokens(point)} if chunk_always or point.phase == "prefill" else {})}


def paged_shape(point: WorkloadPoint, chunk_always: bool = False) -> dict:
    """The paged-KV part of an attention op's shape dict at a point: ``B`` sequences, ``ctx`` tokens in
    the cache after the step (cached + new), ``BS`` block size, and for prefill (or ``chunk_always``)
    ``chunk`` new tokens per sequence. The one place the attention ops read a point."""
    return {**seq_shape(point, chunk_always), "ctx": int(point.context) + new_tokens(point), "BS": DEFAULT_BLOCK_SIZE}


def dedup(shapes: list[dict]) -> list[dict]:
    out: list[dict] = []
    for s in shapes:
        if s not in out:
            out.append(s)
    return out


def paged_layout(g: torch.Generator, batch: int, ctx_lens: list[int], block_size: int, device,
                 spare_blocks: int = 3) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Block tables [B, MB] int32 over a shuffled pool of NB blocks (so paging matters), context
    lens [B] int32, and NB. Unused table entries point at block 0 (never read)."""
    mb = max(1, max((c + block_size - 1) // block_size for c in ctx_lens))
    nb = batch * mb + spare_blocks
    perm = torch.randperm(nb, generator=torch.Generator().manual_seed(int(g.initial_seed()) + 1))
    tables = torch.zeros(batch, mb, dtype=torch.int32)
    used = 0
    for b, c in enumerate(ctx_lens):
        n = (c + block_size - 1) // block_size
        tables[b, :n] = perm[used:used + n].to(torch.int32)
        used += n
    lens = torch.tensor(ctx_lens, dtype=torch.int32)
    return tables.to(device), lens.to(device), nb
