"""The op registry: every op of the forward pass by name, with its plain-torch reference, its
documented signature, an input generator, the shapes the model feeds it and per-dtype tolerances.

    from persistent_engine.ops import registry
    registry.call("rms_norm", x, w, 1e-5)           # the current implementation (override or reference)
    with registry.override({"rms_norm": my_rms_norm}):
        model.step(workload)                        # every call site now runs my_rms_norm

    from persistent_engine.ops.contract import check_op
    check_op("rms_norm", my_rms_norm)               # [] when it honours the contract

Composite ops (``fused``: ``add_rms_norm_linear``, ``silu_mul_linear``) fuse finer ops; unless
overridden they run their ``default``, which calls the fine ops through the registry (so a ``linear``
override still reaches inside them); overriding the composite replaces the whole fusion.

Submodules import torch; this ``__init__`` does not (they load on first attribute access).
"""

from __future__ import annotations

import importlib

__all__ = ["registry", "contract", "OpDef", "check_op"]


def __getattr__(name: str):
    if name in ("registry", "contract"):
        return importlib.import_module(f"{__name__}.{name}")
    if name == "OpDef":
        return importlib.import_module(f"{__name__}.opdef").OpDef
    if name == "check_op":
        return importlib.import_module(f"{__name__}.contract").check_op
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
