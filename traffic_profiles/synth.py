"""Synthetic request logs with chosen distributions, and drifted variants of them.

    python -m traffic_profiles.synth OUT.parquet [--rows 20000] [--rate 5] [--input-median 1000]
        [--input-scale 1.4] [--cache-hit 0.6] [--cv 1] [--seed 0]
    python -m traffic_profiles.synth --variants DIR [--seed 0]    # base + longer + cold + bursty

Model: inter-arrival gaps are gamma with mean 1/rate and coefficient of variation ``cv`` (1 is
Poisson, >1 bursty); prompt and output lengths are log-normal (median, sigma), prompts multiplied by
``input_scale``. Each prompt starts with a shared prefix of ``cache_hit`` of its blocks taken from
one of ``shared_prefixes`` documents (Zipf-popular), the rest is unique, so an unbounded prefix cache
hits about ``cache_hit`` of prompt tokens (a little less: first uses miss, partial blocks).
Hashes are prefix-chained like Mooncake's. Cost: vectorized, ~1 s per million requests.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from .trace import Trace
from .writer import write_parquet


@dataclass(frozen=True)
class SynthConfig:
    rows: int = 20000
    rate: float = 5.0                 # requests per second
    cv: float = 1.0                   # inter-arrival coefficient of variation
    input_median: float = 1000.0
    input_sigma: float = 0.8
    input_scale: float = 1.0          # multiplies every prompt length (1.4: "longer prompts")
    output_median: float = 150.0
    output_sigma: float = 0.7
    cache_hit: float = 0.5            # share of each prompt's blocks taken from a shared prefix
    shared_prefixes: int = 32
    block_size: int = 64
    max_tokens: int = 32768
    seed: int = 0


# Drifted variants relative to a base config (issue 4: longer prompts, fewer cache hits, bursts).
VARIANTS = {
    "base": {},
    "longer": {"input_scale": 1.4},
    "cold": {"cache_hit": -0.2},      # relative: base cache_hit - 0.2
    "bursty": {"cv": 4.0},
}


def variant(base: SynthConfig, name: str) -> SynthConfig:
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}; known: {', '.join(VARIANTS)}")
    changes = dict(VARIANTS[name])
    if "cache_hit" in changes:
        changes["cache_hit"] = max(0.0, base.cache_hit + changes["cache_hit"])
    return replace(base, **changes)


def generate(cfg: SynthConfig) -> Trace:
    """A synthetic trace drawn from ``cfg`` (same config and seed -> same trace)."""
    rng = np.random.default_rng(cfg.seed)
    n = cfg.rows
    shape = 1.0 / (cfg.cv ** 2)                       # gamma: CV = 1/sqrt(shape)
    gaps = rng.gamma(shape, 1.0 / (cfg.rate * shape), size=n)
    gaps[0] = 0.0
    ts = np.cumsum(gaps)
    inp = rng.lognormal(np.log(cfg.input_median), cfg.input_sigma, n) * cfg.input_scale
    out = rng.lognormal(np.log(cfg.output_median), cfg.output_sigma, n)
    inp = np.clip(np.rint(inp), 1, cfg.max_tokens).astype(np.int64)
    out = np.clip(np.rint(out), 1, cfg.max_tokens).astype(np.int64)
    # prefix blocks: the first `shared` blocks of row r come from document doc[r], the rest unique
    blocks = -(-inp // cfg.block_size)
    shared = np.minimum(np.rint(cfg.cache_hit * blocks).astype(np.int64), blocks)
    ranks = np.arange(1, cfg.shared_prefixes + 1)
    doc = rng.choice(cfg.shared_prefixes, size=n, p=(1 / ranks) / (1 / ranks).sum())
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(blocks, out=offsets[1:])
    row = np.repeat(np.arange(n), blocks)
    pos = np.arange(offsets[-1]) - offsets[row]
    unique_ids = (1 << 40) + np.arange(offsets[-1])  # never collide with document ids below
    values = np.where(pos < shared[row], doc[row] * (1 << 24) + pos, unique_ids).astype(np.int64)
    return Trace(timestamp_s=ts, input_tokens=inp, output_tokens=out, hash_offsets=offsets,
                 hash_values=values, block_size=cfg.block_size, source="synthetic", format="synthetic")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m traffic_profiles.synth",
                                description="Write synthetic request logs (canonical parquet).")
    p.add_argument("out", nargs="?", help="output .parquet (one log)")
    p.add_argument("--variants", metavar="DIR", help="write base/longer/cold/bursty logs into DIR")
    for f in SynthConfig.__dataclass_fields__.values():
        p.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    cfg = SynthConfig(**{k: getattr(args, k) for k in SynthConfig.__dataclass_fields__})
    if bool(args.out) == bool(args.variants):
        print("synth: error: give either OUT.parquet or --variants DIR", file=sys.stderr)
        return 2
    if cfg.rows <= 0 or cfg.rate <= 0 or cfg.cv <= 0 or not 0 <= cfg.cache_hit <= 1:
        print("synth: error: rows, rate and cv must be positive, cache-hit within [0, 1]", file=sys.stderr)
        return 2
    jobs = ([(Path(args.out), cfg)] if args.out else
            [(Path(args.variants) / f"{name}.parquet", variant(cfg, name)) for name in VARIANTS])
    for path, c in jobs:
        write_parquet(generate(c), path)
        print(f"wrote {path} ({c.rows} requests)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
