"""Near-ties of the sparse-attention selections (``SELECTIONS``) for the layer-level check (``verify``): each call's
picks recorded (``PickCall``; the reference's with the scores they were chosen by and their unit, ``score_unit``),
the reference's picks replayed where a candidate's differ (``PickReplay``), and a flip's gap in the reference's
scores (``pick_flips``), which ``verify.TieCheck`` holds against its tie band.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from persistent_engine.ops import csa, dsa, msa
from persistent_engine.ops.dsa import GATHER_BUDGET, token_seq_pos


# Three selections keep, per query, the k candidates of highest indexer score and attend only those (``SELECTIONS``):
# DeepSeek-V4's CSA indexer (``csa_indexer``: index_topk compressed entries), DSA's lightning indexer (DeepSeek-V3.2,
# GLM-5.x ``indexer_topk``: index_topk cached positions; GLM's "shared" layers attend with the last full layer's
# picks) and MiniMax-M3's block selection (``block_topk``: topk_blocks blocks of 128 tokens per KV head). Once a
# context holds more candidates than that (Flash: 4 x 512 tokens; GLM-5: 2048; M3: 16 blocks) a correct candidate
# that rounds differently upstream swaps a candidate at the top-k boundary, that query's attention output moves by
# O(its weight on the swapped one), and the next router sees a large difference (on the H200, Flash's slice:
# router flips of 0.5-1 x the router-logit RMS behind correct rms_norm and linear candidates). The layer-level
# check therefore replays the reference's picks where the candidate's differ (``PickReplay``, as verify.RouteReplay
# replays experts: nothing cascades; a GLM shared layer reads the full layer's replayed picks) and checks the
# candidate's own picks against the reference's scores: a flip is excused when the candidate's set is a top-k of
# the reference's scores up to a gap of the tie band x the query's score unit (``score_unit``: the scale of the
# dots' rounding errors, as the logits' RMS is a router's). The band is verify.TIE_RTOL x (2 + d) for a selection d
# layers deep: a router logit carries one rounding of its own (its linear's output), a score two (the query and
# the key, each a bf16 projection normed or rotated and rounded again), and each layer above adds one as for the
# routers. Measured on a scaled Flash slice (tests/persistent_engine/test_verify_csa_ties.py's, 12 steps, every
# linear or rms_norm rounded toward zero): worst excused gap 0.041 in the first CSA layer (d = 1, band 0.094),
# 0.080 in the second (d = 3, band 0.156); the indexer's q projection 10% off: up to 0.31 (rejected). A pick not
# visible, a forced M3 block left out, a repeated pick or a set of another size is never a tie. On the tiny DSA and
# M3 models with their indexer keys tied on purpose (tests/persistent_engine/test_verify_sparse_ties.py), a norm
# rounded toward zero flips 56 DSA queries at exact ties (gap 0) and 32 M3 queries (worst 0.0051, bands 0.094 /
# 0.125), all replayed; the indexer's queries mixed 30% with their neighbours: 0.51-0.86 (DSA), 0.57 (M3), rejected.
@dataclass(frozen=True)
class PickCall:
    """One call of a selecting op (``SELECTIONS``: one CSA / DSA indexer or M3 block selection of one step): each
    query's picks and, in the reference's record, the scores they were picked by. M3's rows are (query, KV head)."""
    op: str                             # the selecting op, a key of SELECTIONS
    ids: torch.Tensor                   # [T, (Hk,) k] int64 picks sorted per row (-1: none; a set, no order)
    scores: torch.Tensor | None         # [T, (Hk,) N] fp32 the N candidates' scores, -inf not visible, +inf forced
                                        # (reference only)
    unit: torch.Tensor | None = None    # [T, (Hk,)] fp32 each row's ``score_unit`` (the gap's unit; reference only)


@dataclass(frozen=True)
class Selection:
    """A selecting op as the tie check reads it: its name in verdicts, what it picks, and ``measure``: the op's
    arguments -> (scores [T, (Hk,) N], unit [T, (Hk,)]) of a ``PickCall``."""
    label: str
    picks: str
    measure: Callable[..., tuple[torch.Tensor, torch.Tensor]]


def score_unit(dots: torch.Tensor, visible: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """The scale by which rounding moves the scores built of ``dots`` [C, H, N] (query . key of each head and
    candidate key, ``visible`` [C, N]): a dot product's rounding error scales with |q| |k| / sqrt(Di), the RMS of
    the dots over the visible keys (as a router logit's with the logits' RMS). ``weights`` [C, H] (an indexer's
    head weights, any fixed scale folded in): the heads' weighted errors add in quadrature, [C]; None: each
    head's own, [C, H]."""
    v = visible[:, None, :]
    msq = dots.float().square().masked_fill(~v, 0.0).sum(-1) / v.sum(-1).clamp_min(1)              # [C, H]
    return msq.sqrt() if weights is None else (weights.float().square() * msq).sum(-1).sqrt()


def _csa_measure(q, weights, keys, n_entries, cu_seqlens_q, context_lens, ratio, topk):
    """CSA: ``csa.indexer_scores`` and each query's unit over its visible compressed entries (head weights times
    Di^-1/2, as the scores). Cost: the indexer's, T x NE x Hi x Di, chunked."""
    t, hi, di = q.shape
    ne = keys.shape[1]
    seq, pos = token_seq_pos(cu_seqlens_q, context_lens, t)
    w = torch.arange(ne, device=q.device)
    vis = (w[None, :] < ((pos + 1) // ratio)[:, None]) & (w[None, :] < n_entries[seq][:, None])      # [T, NE]
    unit = torch.zeros(t, dtype=torch.float32, device=q.device)
    step = max(1, min(t, GATHER_BUDGET // max(1, ne * max(di, hi))))
    for c0 in range(0, t, step):
        c1 = min(t, c0 + step)
        dots = torch.einsum("thd,ted->the", q[c0:c1].float(), keys.float()[seq[c0:c1]])              # [C, Hi, NE]
        unit[c0:c1] = score_unit(dots, vis[c0:c1], weights[c0:c1].float() * di ** -0.5)
    return csa.indexer_scores(q, weights, keys, n_entries, cu_seqlens_q, context_lens, ratio), unit


def _dsa_measure(q, weights, k_cache, block_tables, cu_seqlens_q, context_lens, topk):
    """DSA: ``dsa.indexer_scores`` [T, L] and each query's unit over its visible positions [T]."""
    unit = torch.zeros(q.shape[0], dtype=torch.float32, device=q.device)
    for c0, c1, dots, visible in dsa.key_dots(q, k_cache, block_tables, cu_seqlens_q, context_lens):
        unit[c0:c1] = score_unit(dots, visible, weights[c0:c1])
    return dsa.indexer_scores(q, weights, k_cache, block_tables, cu_seqlens_q, context_lens), unit


def _msa_measure(q, k_cache, block_tables, cu_seqlens_q, context_lens, block_size, topk_blocks, init_blocks,
                 local_blocks):
    """M3: ``msa.block_scores`` [T, Hk, nblk] and each (query, KV head)'s unit over its visible positions [T, Hk]
    (a block's score is one of its dots)."""
    unit = torch.zeros(q.shape[:2], dtype=torch.float32, device=q.device)
    for c0, c1, dots, visible in dsa.key_dots(q, k_cache, block_tables, cu_seqlens_q, context_lens):
        unit[c0:c1] = score_unit(dots, visible)
    return msa.block_scores(q, k_cache, block_tables, cu_seqlens_q, context_lens, block_size, init_blocks,
                            local_blocks), unit


SELECTIONS = {"csa_indexer": Selection("CSA indexer", "entries", _csa_measure),
              "indexer_topk": Selection("DSA indexer", "positions", _dsa_measure),
              "block_topk": Selection("M3 block", "blocks", _msa_measure)}


class PickReplay:
    """Wraps the implementation of the selecting op ``op`` that runs: records each call's picks (with ``refs``
    None, the reference's record, also its scores and units: ``SELECTIONS[op].measure`` of the same inputs) into
    ``calls``; with ``refs`` (the reference's calls of the step, in the same order) a query (M3: a query's KV
    head) whose pick set differs from the reference's gets the reference's picks, every other what the op
    returned. The picks are all the op passes on (the attention reads the set), so this holds for a candidate's
    own indexer too: its choices are still checked (``pick_flips``)."""

    def __init__(self, op: str, fn, refs: list | None, calls: list):
        self.op, self.fn, self.refs, self.calls = op, fn, refs, calls

    def __call__(self, *args):
        out = self.fn(*args)
        if not (isinstance(out, torch.Tensor) and out.dim() >= 2 and not out.is_floating_point()):
            self.calls.append(None)
            return out
        j, ids = len(self.calls), out.detach().long().sort(dim=-1).values
        scores = unit = None
        if self.refs is None:                       # the reference's record: what the picks were chosen by
            scores, unit = (x.detach().clone() for x in SELECTIONS[self.op].measure(*args))
        self.calls.append(PickCall(self.op, ids.clone(), scores, unit))
        ref = self.refs[j] if self.refs is not None and j < len(self.refs) else None
        if not isinstance(ref, PickCall) or ref.op != self.op or ref.ids.shape != ids.shape:
            return out
        flipped = (ref.ids.to(ids.device) != ids).any(-1)                           # [T, (Hk)]
        if not bool(flipped.any()):
            return out
        return torch.where(flipped[..., None], ref.ids.to(out.device, out.dtype), out)


def pick_flips(ref: PickCall, cand_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries whose pick set (M3: any KV head's) differs from the reference's, and for each the gap (the
    reference's scores / that row's ``score_unit``, the largest over the query's rows) by which the candidate's
    set misses being a top-k of them: max score left out minus min score picked (<= 0: an exact tie). inf for a
    pick not visible, out of range or repeated, a forced block left out, a set of another size, or no reference
    scores. Cost: O(F N) for F flipped rows."""
    k, t = ref.ids.shape[-1], ref.ids.shape[0]
    rids = ref.ids.reshape(-1, k)
    cand = cand_ids.to(ref.ids.device).long().sort(dim=-1).values.reshape(-1, k)
    row = (rids != cand).any(-1).nonzero().flatten()                               # flipped rows [F]
    tok, inv = torch.unique(row // max(1, rids.shape[0] // max(1, t)), return_inverse=True)
    if row.numel() == 0 or ref.scores is None or ref.unit is None:
        return tok.cpu(), torch.full((tok.numel(),), float("inf"), dtype=torch.float64)
    s, ids = ref.scores.reshape(rids.shape[0], -1)[row].double(), cand[row]
    f, n = s.shape
    vis, picked = s > float("-inf"), ids >= 0
    valid = ((ids < n).all(-1) & ~((ids[:, 1:] == ids[:, :-1]) & picked[:, 1:]).any(-1)
             & (picked.sum(-1) == (rids[row] >= 0).sum(-1)))
    slot = torch.where(picked & (ids < n), ids, torch.full_like(ids, n))
    chosen = torch.zeros(f, n + 1, dtype=torch.bool, device=s.device).scatter_(1, slot, True)[:, :n]
    valid &= ~(chosen & ~vis).any(-1)
    min_in = s.masked_fill(~chosen, float("inf")).min(-1).values
    max_out = s.masked_fill(chosen | ~vis, float("-inf")).max(-1).values
    unit = ref.unit.reshape(-1)[row].double().clamp_min(1e-30)
    gap = torch.nan_to_num((max_out - min_in).clamp_min(0) / unit, nan=float("inf"), posinf=float("inf"))
    gap = gap.masked_fill(~valid, float("inf"))
    worst = torch.full((tok.numel(),), float("-inf"), dtype=torch.float64, device=gap.device)
    return tok.cpu(), worst.scatter_reduce_(0, inv, gap, "amax").cpu()
