"""The step as ``torch.compile`` runs it: the baseline every speedup is measured against (issue 39).

A user who serves a model already has ``torch.compile``; a kernel that beats tkcc's eager reference ops but
not the compiled step gains them nothing. So an executor (the baseline one and every candidate's) runs its
timed step compiled by inductor: the reference ops traced and fused as ``torch.compile`` of the model would,
and, on the candidate's side, each override called as an opaque operator (``torch.compiler.disable``:
dynamo breaks the graph around it, so inductor fuses everything up to it and from it on, never into it, as
a ``torch.library`` custom op would without a schema to write for every op's arguments). On CUDA the compiled
step is then captured in a CUDA graph like the eager one, so the breaks cost no host time; on CPU each costs
one return to Python (~20 us).

    step = compiled_step(model)                  # torch.compile(model.step, dynamic=False), once per process
    with registry.override(opaque(overrides)):   # the candidate's functions, opaque to dynamo
        logits = step(workload)                  # first call per point shape compiles (CPU 10-20 s, cached)

Correctness stays with the eager reference: the judge computes its references eagerly, and what a candidate
is verified on (op checks, layer steps) runs eagerly too; only the timed runs (the judge's, and ``plan
apply``'s, which times through executors) run compiled. The baseline executor compiles its points at
start-up; a candidate's executor gets the graphs of its op set from the judge's compile cache
(``compile_cache.py``: compiled once per op set by an executor no candidate ran in), so it traces and loads
rather than compiles. On by default on CUDA; ``TKCC_COMPILED=0`` turns it off, ``=1`` on CPU (there every
executor compiles C++ for every point shape: tiny-dense 32 s cold, 5.9 s from the cache on this 2-core
machine, which ``make demo`` and CI cannot afford per candidate).
"""

from __future__ import annotations

import os
from typing import Callable, Mapping

import torch

COMPILED_ENV = "TKCC_COMPILED"
DEFAULT = {"cuda": True, "cpu": False}       # see the module doc: CPU compiles cost too much per executor
# one compiled graph per point shape (dynamic=False): the judge's points and their variants, with room
RECOMPILE_LIMIT = 64


def compiled_default(device_type: str) -> bool:
    """Whether steps run compiled on this device: ``TKCC_COMPILED`` when set (1/0), else DEFAULT."""
    raw = os.environ.get(COMPILED_ENV, "").strip()
    if raw in ("0", "1"):
        return raw == "1"
    return DEFAULT.get(device_type, False)


def baseline_words(compiled: bool) -> str:
    """What a speedup is measured against, in words (reports, the CLI, the UI)."""
    if compiled:
        return "the step as torch.compile (inductor) runs it, overrides as opaque calls"
    return "tkcc's eager reference ops (not torch.compile: speedups read higher than against the compiler)"


def compiled_step(model) -> Callable:
    """``model.step`` under ``torch.compile`` (inductor, static shapes). Compiles on the first call of each
    point shape and override set, not here."""
    import torch._dynamo
    import torch._inductor.config

    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, RECOMPILE_LIMIT)
    # compiled in this thread: no pool of compile threads or worker processes, which the executor's guards
    # would take for a candidate's (a 2-layer llama slice compiles serially in seconds)
    torch._inductor.config.compile_threads = 1
    return torch.compile(model.step, dynamic=False)


def warm_compiler(device) -> None:
    """Compile and run a two-op function once: dynamo's patches of ``torch.nn.Module`` and inductor's
    worker threads exist from here on, so the executor's guards (snapshot after start-up) take them as the
    process's own, not as what a candidate did (~3 s on CPU, once per executor)."""
    x = torch.ones(8, device=device)
    torch.compile(lambda t: (t * 2).sin(), dynamic=False)(x)


def opaque(overrides: Mapping[str, Callable]) -> dict[str, Callable]:
    """Each override wrapped so that dynamo does not trace into it: one opaque call in the compiled step."""
    return {name: torch.compiler.disable(fn, recursive=True) for name, fn in overrides.items()}
