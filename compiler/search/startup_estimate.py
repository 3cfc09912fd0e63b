"""Can the engines start within ``--budget`` on this machine? Estimated before a run starts anything.

The basis, best first:
  1. what this machine measured before for the same model, device and layers of both tiers: every run records
     the wall seconds from starting its fleet to all engines ready (``record``), or, when they were not ready
     within the run's budget, the seconds they were given as a lower bound ("more than N s");
  2. else a rule that only refuses what cannot fit (``fallback_s``, a lower bound): the measured floor of one
     engine's spawn-to-ready plus its weights made at this device's rate; the tiers start side by side, so the
     slower tier's.
The records live in ``$XDG_CACHE_HOME/tkcc/startup.json`` (default ``~/.cache/tkcc/startup.json``; the file
``TKCC_STARTUP_FILE`` names instead, as tests do), one per user, written atomically (a temporary file renamed over
it); a missing or unreadable file is no record.
``check`` raises ``StartupTooSlow`` (exit 2, one line, before the board or any output is written) when the
estimate exceeds what the budget gives start-up (``Budget.search_end`` minus now).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from compiler.search.budget import Budget, BudgetError

__all__ = ["StartupTooSlow", "cache_path", "check", "estimate", "fallback_s", "key", "record"]

# Spawn to ready of one engine, floor: tiny-dense (1 layer) on a 2-core CPU took 3.1-4.1 s
# (benchmarks/results/cpu-hot_reload.json); llama-1b (2 layers) on an H100 12.2 s eager, 42.9 s with the compiled
# baseline (h100-hot-reload-1bc313e.json, h100-hot-reload-compiled.json). The smaller of each kind is kept.
FLOOR_S = {"cpu": 3.0, "cuda": 12.0}
# Random weights are drawn on the engine's device: bf16 torch.randn on one CPU thread ran at 0.13 GB/s on the
# 2-core CI machine (2026-12-06); on a GPU drawing them is far below the floor (0.41-0.44 s of llama-1b's 12.2
# and 42.9 s above), so only the floor counts there.
WEIGHTS_BYTES_PER_S = {"cpu": 0.13e9, "cuda": float("inf")}


class StartupTooSlow(BudgetError):
    """The engines cannot start within the run's budget on this machine (the message holds the estimate)."""


def cache_path() -> Path:
    if os.environ.get("TKCC_STARTUP_FILE"):
        return Path(os.environ["TKCC_STARTUP_FILE"])
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "tkcc" / "startup.json"


def key(model: str, device: dict, fast_layers, slow_layers, weights: str | None = None) -> str:
    """One record per model, device (kind and name), layers of both tiers and weights (random or a checkpoint)."""
    layers = ",".join(map(str, fast_layers)) + " / " + ",".join(map(str, slow_layers))
    return f"{model} | {device['kind']}:{device['name']} | layers {layers} | {'checkpoint' if weights else 'random'}"


def _load() -> dict:
    try:
        doc = json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def record(k: str, seconds: float, ready: bool = True) -> None:
    """Keep ``seconds`` for ``k``: measured to ready (``ready``), or a lower bound (not ready by then; kept only
    over a smaller lower bound or none). Best effort: an unwritable cache loses the record, not the run."""
    doc = _load()
    old = doc.get(k) if isinstance(doc.get(k), dict) else None
    if not ready and old is not None and (old.get("ready") or float(old.get("seconds", 0)) >= seconds):
        return
    doc[k] = {"seconds": round(float(seconds), 1), "ready": bool(ready), "when": time.strftime("%Y-%m-%d")}
    path = cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".startup.", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        pass


def fallback_s(device_kind: str, tier_weight_bytes: list[int]) -> float:
    """A lower bound of the fleet's start-up with nothing measured: the slower tier's floor plus weights."""
    kind = "cuda" if device_kind == "cuda" else "cpu"
    return FLOOR_S[kind] + max(tier_weight_bytes, default=0) / WEIGHTS_BYTES_PER_S[kind]


def estimate(k: str, device_kind: str, tier_weight_bytes: list[int]) -> tuple[float, str]:
    """(seconds, basis in words) of the fleet's start-up."""
    rec = _load().get(k)
    if isinstance(rec, dict) and isinstance(rec.get("seconds"), (int, float)):
        took = "took" if rec.get("ready") else "were not ready after"
        return float(rec["seconds"]), f"they {took} {rec['seconds']:.0f} s on this machine ({rec.get('when', '?')}, " \
                                      f"recorded in {cache_path()})"
    gb = max(tier_weight_bytes, default=0) / 1e9
    return fallback_s(device_kind, tier_weight_bytes), (
        f"they need at least {fallback_s(device_kind, tier_weight_bytes):.0f} s on {device_kind} (nothing measured "
        f"here yet: an engine's start-up floor and {gb:.2f} GB of weights)")


def check(budget: Budget, budget_text: str, k: str, device_kind: str, tier_weight_bytes: list[int]) -> float:
    """The estimate, or ``StartupTooSlow`` when it exceeds what the budget leaves start-up. Unbounded: no check."""
    seconds, basis = estimate(k, device_kind, tier_weight_bytes)
    if budget.wall_s is None:
        return seconds
    left = budget.left(budget.search_end)
    if seconds > left:
        # start-up ends by search_end, which is the budget less its compose and write reserves (40% in all,
        # capped): the smallest budget whose search_end leaves ``seconds`` (and a minute to search), rounded up
        need = next(m for m in range(1, 10 ** 6) if Budget(60.0 * m, 0.0).search_end >= seconds + 60)
        raise StartupTooSlow(f"--budget {budget_text} leaves {left:.0f} s to start the engines; {basis}; "
                             f"give --budget {need}m or more")
    return seconds
