"""Trace: a request log in memory, columnar, validated, sorted by arrival.

Every reader (``traffic_profiles.readers``) produces one ``Trace``; the profile, the replay and the
synthetic generator consume and produce it. Arrays are numpy, one entry per request, sorted by
``timestamp_s`` (stable, so equal timestamps keep file order). Costs: O(rows) memory, ~40 bytes a
request plus 8 bytes a prefix block.

Prefix blocks are stored CSR-style: the block hashes of request ``i`` are
``hash_values[hash_offsets[i]:hash_offsets[i + 1]]``. Hashes are *prefix-chained* (as in the Mooncake
trace): a hash names the whole prompt prefix up to and including its block, so two requests share a
hash only if they share every token before it. Each block holds ``block_size`` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

DEFAULT_BLOCK_SIZE = 512      # Mooncake's block; also the canonical default when none is given


class TraceError(ValueError):
    """A file that is not a usable trace. The CLI prints it as one line (file, row, problem), exit 2."""

    user_error = True


@dataclass(frozen=True, eq=False)
class Trace:
    timestamp_s: np.ndarray          # float64 [N], seconds since the first request, sorted, >= 0
    input_tokens: np.ndarray         # int64 [N], prompt tokens (cached ones included)
    output_tokens: np.ndarray        # int64 [N], generated tokens
    cached_tokens: np.ndarray | None = None   # int64 [N], prompt tokens served from a prefix cache
    session_id: np.ndarray | None = None      # int64 [N], dense codes 0..S-1 of the logged session ids
    hash_offsets: np.ndarray | None = None    # int64 [N+1], CSR offsets into hash_values
    hash_values: np.ndarray | None = None     # int64 [B], prefix-chained block hashes
    block_size: int = DEFAULT_BLOCK_SIZE
    model: np.ndarray | None = None           # object [N] of str, or None
    region: np.ndarray | None = None          # object [N] of str, or None
    source: str = ""                          # the file it came from (not part of any hash)
    format: str = "canonical"                 # canonical | azure | mooncake | burstgpt | synthetic
    start_time: str | None = None             # ISO wall-clock time of the first request, when known

    def __post_init__(self) -> None:
        n = len(self.timestamp_s)
        for name in ("input_tokens", "output_tokens", "cached_tokens", "session_id", "model", "region"):
            a = getattr(self, name)
            if a is not None and len(a) != n:
                raise ValueError(f"Trace.{name} has {len(a)} rows, timestamp_s has {n}")
        if (self.hash_offsets is None) != (self.hash_values is None):
            raise ValueError("hash_offsets and hash_values come together")
        if self.hash_offsets is not None and len(self.hash_offsets) != n + 1:
            raise ValueError("hash_offsets must have rows + 1 entries")

    # ------------------------------------------------------------------ basic facts
    @property
    def rows(self) -> int:
        return int(len(self.timestamp_s))

    @property
    def duration_s(self) -> float:
        return float(self.timestamp_s[-1] - self.timestamp_s[0]) if self.rows else 0.0

    @property
    def has_hashes(self) -> bool:
        return self.hash_offsets is not None

    def hash_ids(self, i: int) -> np.ndarray:
        """Block hashes of request ``i`` (a view)."""
        if self.hash_offsets is None or self.hash_values is None:
            return np.empty(0, dtype=np.int64)
        return self.hash_values[self.hash_offsets[i]:self.hash_offsets[i + 1]]

    # ------------------------------------------------------------------ slicing
    def take(self, idx: np.ndarray | slice) -> "Trace":
        """Rows ``idx`` (sorted indices or a slice) as a new trace, timestamps rebased to 0."""
        sel = np.arange(self.rows)[idx] if isinstance(idx, slice) else np.asarray(idx, dtype=np.int64)
        pick = lambda a: None if a is None else a[sel]  # noqa: E731
        offsets = values = None
        if self.hash_offsets is not None and self.hash_values is not None:
            lo, hi = self.hash_offsets[sel], self.hash_offsets[sel + 1]
            lengths = hi - lo
            offsets = np.zeros(len(sel) + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            # gather every block of the selected rows: position j of row r -> lo[r] + j
            starts = np.repeat(lo - offsets[:-1], lengths)
            values = self.hash_values[starts + np.arange(offsets[-1])]
        ts = self.timestamp_s[sel]
        ts = ts - ts[0] if len(ts) else ts
        return replace(self, timestamp_s=ts, input_tokens=self.input_tokens[sel],
                       output_tokens=self.output_tokens[sel], cached_tokens=pick(self.cached_tokens),
                       session_id=pick(self.session_id), hash_offsets=offsets, hash_values=values,
                       model=pick(self.model), region=pick(self.region))

    def halves(self) -> tuple["Trace", "Trace"]:
        """First and second half by row count (the usual no-drift control)."""
        h = self.rows // 2
        return self.take(slice(0, h)), self.take(slice(h, self.rows))
