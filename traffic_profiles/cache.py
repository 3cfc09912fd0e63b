"""Prefix-cache hits and sessions from prefix-chained block hashes (see ``trace.Trace``).

A request's prompt is served from the cache for its longest leading run of blocks already cached
(vLLM / SGLang prefix caching); afterwards all its blocks are cached. Hit rate = cached prompt
tokens / prompt tokens (token-weighted), a hit block counting ``block_size`` tokens, capped at the
request's prompt length.

- ``unbounded_hits``: a cache that never evicts; vectorized, O(B log B) for B blocks in the log.
- ``lru_hits``: an LRU cache of ``capacity`` blocks; a Python loop, ~1 us per block.
- ``infer_sessions``: request j continues request i's conversation when j's prompt starts with the
  whole of i's prompt (i's last block hash appears in j); O(B log N).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from .trace import Trace


def _row_of_block(trace: Trace) -> np.ndarray:
    assert trace.hash_offsets is not None
    return np.repeat(np.arange(trace.rows), np.diff(trace.hash_offsets))


def _cached_tokens(trace: Trace, hit_blocks: np.ndarray) -> np.ndarray:
    return np.minimum(hit_blocks * trace.block_size, trace.input_tokens)


def unbounded_hits(trace: Trace) -> np.ndarray:
    """Cached prompt tokens per request with an unbounded prefix cache: int64 [N]."""
    values, offsets = trace.hash_values, trace.hash_offsets
    assert values is not None and offsets is not None
    if len(values) == 0:
        return np.zeros(trace.rows, dtype=np.int64)
    rows = _row_of_block(trace)
    # a block is cached when an earlier *request* held it (the first holder's row is the min row)
    uniq, inverse = np.unique(values, return_inverse=True)
    first_row = np.full(len(uniq), trace.rows, dtype=np.int64)
    np.minimum.at(first_row, inverse, rows)
    seen = first_row[inverse] < rows
    # leading run of cached blocks per request: position of the first miss within its row
    pos = np.arange(len(values)) - offsets[rows]
    miss_pos = np.where(seen, np.iinfo(np.int64).max, pos)
    lengths = np.diff(offsets)
    lead = lengths.copy()
    nonempty = lengths > 0
    first_miss = np.minimum.reduceat(miss_pos, offsets[:-1][nonempty])
    lead[nonempty] = np.minimum(first_miss, lengths[nonempty])
    return _cached_tokens(trace, lead)


def lru_hits(trace: Trace, capacity: int) -> np.ndarray:
    """Cached prompt tokens per request with an LRU cache of ``capacity`` blocks: int64 [N]."""
    values, offsets = trace.hash_values, trace.hash_offsets
    assert values is not None and offsets is not None
    cache: OrderedDict[int, None] = OrderedDict()
    lead = np.zeros(trace.rows, dtype=np.int64)
    vals = values.tolist()
    for i in range(trace.rows):
        lo, hi = int(offsets[i]), int(offsets[i + 1])
        run, hitting = 0, True
        for h in vals[lo:hi]:
            if h in cache:
                cache.move_to_end(h)
                run += hitting
            else:
                hitting = False
                cache[h] = None
                if len(cache) > capacity:
                    cache.popitem(last=False)
        lead[i] = run
    return _cached_tokens(trace, lead)


def infer_sessions(trace: Trace) -> np.ndarray:
    """Session code per request (int64 [N], 0..S-1) from prompts that extend an earlier prompt."""
    values, offsets = trace.hash_values, trace.hash_offsets
    assert values is not None and offsets is not None
    n = trace.rows
    lengths = np.diff(offsets)
    has = np.flatnonzero(lengths > 0)
    parent = np.full(n, -1, dtype=np.int64)
    if len(has):
        last = values[offsets[has + 1] - 1]                  # the hash naming each whole prompt
        order = np.argsort(last, kind="stable")
        last_sorted, owner = last[order], has[order]
        # for duplicates keep the earliest owner (stable sort puts it first)
        rows = _row_of_block(trace)
        k = np.searchsorted(last_sorted, values)
        k = np.minimum(k, len(last_sorted) - 1)
        match = (last_sorted[k] == values) & (owner[k] < rows)
        # the longest matching earlier prompt is the parent: the last matching block of each row
        # (blocks are in row order, positions ascending, so it is the last match before the next row)
        mrows, mowners = rows[match], owner[k[match]]
        last_of_row = np.ones(len(mrows), dtype=bool)
        last_of_row[:-1] = mrows[1:] != mrows[:-1]
        parent[mrows[last_of_row]] = mowners[last_of_row]
    session = np.empty(n, dtype=np.int64)
    nxt = 0
    par = parent.tolist()
    for j in range(n):                               # parents come earlier: one forward pass
        p = par[j]
        if p >= 0:
            session[j] = session[p]
        else:
            session[j] = nxt
            nxt += 1
    return session


def session_summary(session: np.ndarray) -> dict:
    """``{count, mean_turns, max_turns, multi_turn_share}`` of session codes (-1: no session)."""
    s = session[session >= 0]
    if len(s) == 0:
        return {"count": 0, "mean_turns": 0.0, "max_turns": 0, "multi_turn_share": 0.0}
    turns = np.bincount(s)
    turns = turns[turns > 0]
    return {"count": int(len(turns)), "mean_turns": float(turns.mean()), "max_turns": int(turns.max()),
            "multi_turn_share": float(turns[turns > 1].sum() / turns.sum())}
