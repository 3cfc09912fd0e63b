"""The values the optimize loop's phases hand each other (compiler/search/loop.py): what is known before any engine
starts (``RunInputs``), the run's bookkeeping (``RunContext``), the started fleet (``StartedEngines``), the baseline
(``Baseline``) and what the engines' phases leave for the plan (``Outcome``); and the best-effort board
calls every phase makes (a board failure is logged and never stops a run)."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from persistent_engine import WorkloadPoint

from compiler.search import inputs
from compiler.search.acceptance import Accepted, Composition
from compiler.search.budget import Budget
from compiler.search.memory import RunMemory
from compiler.search.progress import Progress
from compiler.search.tally import Tally
from compiler.search.throughput import DeviceClock

if TYPE_CHECKING:
    from bulletin_board import BoardAPI
    from compiler.fleet.local import Fleet
    from compiler.search.loop import OptimizeConfig

log = logging.getLogger("tkcc.loop")


@dataclass(frozen=True)
class RunInputs:
    """What the run knows before any engine starts (compiler/search/inputs.py): the model, the device present,
    the traffic and its workload points, the tiers' layers and inputs, the cost model's layout."""

    spec: Any                                # persistent_engine.models.spec.ModelSpec
    device: dict                             # inputs.detect_device + "matches_hw", "target"
    traffic: inputs.TrafficInput
    points: list[WorkloadPoint]
    fast_layers: list[int]
    slow_layers: list[int]
    tier_inputs: dict                        # tier -> persistent_engine.tier_inputs.TierInputs as JSON
    layout: dict | None
    projected: dict | None
    layout_note: str
    notes: tuple[str, ...] = ()              # e.g. the slow tier shrunk to fit this device's memory


@dataclass(frozen=True)
class RunContext:
    """The run's bookkeeping once its board row exists."""

    cfg: OptimizeConfig                      # as continued / recovered (seeds, parent version)
    board: BoardAPI
    board_url: str
    run_id: Any
    memory: RunMemory
    progress: Progress
    stop: threading.Event
    budget: Budget
    t_start: float
    deployment_hash: str = ""                # the traffic hash naming the run's deployment (deployment_hash_of)


@dataclass(frozen=True)
class StartedEngines:
    fleet: Fleet                             # compiler.fleet.local.LocalFleet | compiler.fleet.ray_fleet.RayFleet
    clock: DeviceClock
    tier_info: dict                          # tier -> {"inputs", "routing"?} for plan.json


@dataclass(frozen=True)
class Baseline:
    profile: dict                            # the fast engine's per-op profile (Supervisor.profile)
    op_ms: dict[str, float]
    noise: dict[str, float]                  # tier -> A/A spread
    eval_s: dict[str, float] = field(default_factory=dict)   # tier -> seconds of one A/A evaluation (median)


@dataclass
class Outcome:
    """What the engines' phases leave for the plan."""

    baseline: Baseline
    composition: Composition | None
    accepted: list[Accepted]
    tried: int
    interrupted: bool
    restarts: int
    agent_reports: list[dict]
    tier_info: dict                          # StartedEngines.tier_info
    clock: DeviceClock
    torch_compile: dict | None = None        # plan vs torch.compile of the slow-tier slice (--vs-torch-compile)
    tally: Tally | None = None               # the run's one count (compiler/search/tally.py)



def best_effort(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """Board bookkeeping is best effort: a failure is logged and never stops a run."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001
        log.warning("%s failed: %s", getattr(fn, "__name__", fn), e)
        return None
