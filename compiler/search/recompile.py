"""``tkcc recompile``: compile again only when traffic drifted.

The new traffic is profiled and diffed against the profile stored with the plan (the traffic
package's drift test: effect sizes against thresholds, per feature). No drift: nothing is written
(not even the board). Drift (or ``force``): the loop runs on the new traffic, seeded with the
plan's own optimizations (each re-verified and re-measured on the new workload points before the
agents start), and writes a new plan version beside the old one in the same plan root.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from compiler.search import inputs
from compiler.plan import artifact as plan_mod
from compiler.search.loop import OptimizeResult, optimize
from compiler.search.run_state import OptimizeConfig


@dataclass(frozen=True)
class RecompileResult:
    drift: bool
    features: tuple[dict, ...]
    old_version_dir: Path
    result: OptimizeResult | None        # None when nothing was recompiled


def check_drift(plan_path: str | Path, traffic: str) -> tuple[bool, list[dict], plan_mod.Plan, Path]:
    """(drifted, per-feature rows, plan, its version directory); writes nothing."""
    plan, vdir = plan_mod.load(plan_path)
    old = plan_mod.load_profile(vdir)
    from persistent_engine.models.spec import ModelSpec
    new = inputs.read_traffic(traffic, ModelSpec.from_name(plan.model), plan.hw, profile_only=True)
    drifted, features = inputs.drift(old, new.profile)
    return drifted, features, plan, vdir


def recompile(plan_path: str | Path, traffic: str, *, budget_s: float = 600.0, force: bool = False,
              agents: str | None = None, device: str = "auto", board: str | None = None,
              fleet: str = "local", quiet: bool = False, **overrides) -> RecompileResult:
    """Diff, and when drifted (or ``force``) run the seeded loop into the plan's root."""
    drifted, features, plan, vdir = check_drift(plan_path, traffic)
    if not drifted and not force:
        return RecompileResult(False, tuple(features), vdir, None)
    slow = plan.tiers.get("slow", {}).get("layers")
    cfg = OptimizeConfig(model=plan.model, hw=plan.hw, traffic=str(traffic), out=str(plan_mod.root_of(vdir)),
                         budget_s=budget_s, agents=agents or plan.run.get("agents") or "offline:auto",
                         board=board, device=device, slow_layers=len(slow) if slow else None,
                         fleet=fleet, seeds=plan_mod.seeds_of(plan, vdir), parent_version=plan.version, quiet=quiet,
                         ttft_ms=(plan.run.get("slo") or {}).get("ttft_ms"),
                         tpot_ms=(plan.run.get("slo") or {}).get("tpot_ms"),
                         drift={"features": list(features), "old_hash": plan.traffic.get("hash", ""),
                                "forced": not drifted})
    if overrides:
        cfg = dataclasses.replace(cfg, **overrides)
    return RecompileResult(drifted, tuple(features), vdir, optimize(cfg))
