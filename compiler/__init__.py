"""compiler: the ``tkcc`` CLI, the optimize loop, the fleet, acceptance and composition, the plan
artifact and report, drift-triggered recompile and the web UI. Nothing imports this package.

    from compiler import OptimizeConfig, optimize, recompile, load_plan_overrides
    result = optimize(OptimizeConfig(model="llama-1b", hw="h200", traffic="prod.parquet", out="plans/prod"))
    overrides, config = load_plan_overrides("plans/prod")     # -> registry.override(overrides)

Attributes load lazily (the CLI must start without torch).
"""

from __future__ import annotations

import importlib

_LAZY = {
    "OptimizeConfig": "compiler.search.loop", "OptimizeResult": "compiler.search.loop",
    "optimize": "compiler.search.loop",
    "recompile": "compiler.search.recompile", "RecompileResult": "compiler.search.recompile",
    "Plan": "compiler.plan.artifact", "PlanOptimization": "compiler.plan.artifact",
    "PlanError": "compiler.plan.artifact", "load_plan": "compiler.plan.artifact",
    "load_plan_overrides": "compiler.plan.apply", "apply_plan": "compiler.plan.apply",
    "check_plan": "compiler.plan.apply", "AcceptanceConfig": "compiler.search.acceptance",
}
_RENAMED = {"load_plan": "load"}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), _RENAMED.get(name, name))
    raise AttributeError(f"module 'compiler' has no attribute {name!r}")
