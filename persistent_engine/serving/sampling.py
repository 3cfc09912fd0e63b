"""Per-request sampling for the serving engine: greedy rows in one ``sample`` op call, the others one
row at a time with their temperature, nucleus (top_p) and seed.

A seeded request draws token ``i`` with seed ``hash(seed, i)``, so the same request with the same seed
gives the same text whatever else is in the batch. Without a seed a process-wide counter is used.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from persistent_engine.ops.registry import call

__all__ = ["SamplingParams", "sample_rows", "top_p_mask"]

_unseeded = itertools.count(1 << 40)


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


def top_p_mask(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """logits[V] with every token outside the smallest set of total probability >= top_p set to -inf."""
    if top_p >= 1.0:
        return logits
    probs, order = torch.softmax(logits.float(), dim=-1).sort(descending=True)
    outside = probs.cumsum(-1) - probs >= top_p              # the first token is always kept
    return logits.clone().index_fill_(-1, order[outside], float("-inf"))


def sample_rows(logits: torch.Tensor, params: list[SamplingParams], steps: list[int]) -> list[int]:
    """Token of each row of ``logits[B, V]`` (fp32) under its request's ``params``; ``steps[i]``: how
    many tokens row i's request has produced (its seed stream position)."""
    out = [0] * len(params)
    greedy = [i for i, p in enumerate(params) if p.greedy]
    if greedy:
        for i, t in zip(greedy, call("sample", logits[greedy], 0.0, 0).tolist()):
            out[i] = int(t)
    for i, p in enumerate(params):
        if p.greedy:
            continue
        seed = hash((p.seed, steps[i])) % (1 << 62) if p.seed is not None else next(_unseeded)
        row = top_p_mask(logits[i], p.top_p)[None]
        out[i] = int(call("sample", row, float(p.temperature), seed)[0])
    return out
