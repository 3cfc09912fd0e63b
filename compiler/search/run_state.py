"""The values the optimize loop's phases hand each other (compiler/search/loop.py): what the run was asked
(``OptimizeConfig``), what is known before any engine starts (``RunInputs``), the run's bookkeeping (``RunContext``), the started fleet (``StartedEngines``), the baseline
(``Baseline``) and what the engines' phases leave for the plan (``Outcome``); and the best-effort board
calls every phase makes (a board failure is logged and never stops a run)."""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from persistent_engine import WorkloadPoint

from compiler.search import inputs
from compiler.search.acceptance import AcceptanceConfig, Accepted, Composition
from compiler.search.budget import Budget
from compiler.search.memory import RunMemory
from compiler.search.progress import Progress
from compiler.search.tally import Tally
from compiler.search.throughput import DeviceClock

if TYPE_CHECKING:
    from bulletin_board import BoardAPI
    from compiler.fleet.local import Fleet

log = logging.getLogger("tkcc.loop")


@dataclass(frozen=True)
class OptimizeConfig:
    """What ``tkcc optimize`` was asked (compiler/commands/optimize.py builds it; the library API takes it)."""

    model: str
    hw: str
    traffic: str
    out: str
    budget_s: float = 600.0                  # the agents' search time (after the baseline)
    wall_s: float | None = None              # the whole run's bound (compiler/search/budget.py); None: unbounded
    agents: str = "offline:auto"
    board: str | None = None                 # default: sqlite:///<out>/board.db
    device: str = "auto"
    fast_layers: int | None = None
    slow_layers: int | None = None
    fleet: str = "local"                     # "local" | "ray"
    ray_address: str | None = None           # None: an existing cluster (RAY_ADDRESS) or a local one
    max_points: int = 4
    gpus: int | None = None                  # GPUs of the target deployment (cost model); None: detected or 1
    timeout_s: float = 300.0                 # engine watchdog per evaluation
    vs_torch_compile: bool = False           # also time torch.compile of the slow-tier slice (in process)
    aa_runs: int = 3                         # reference-vs-itself runs per tier to measure noise
    seeds: tuple[tuple[str, str], ...] = ()  # (name, source) re-verified first (recompile, continue)
    continue_plan: bool = True               # seed from the newest version already in ``out`` (same model/hw)
    parent_version: int | None = None
    drift: dict | None = None                # recompile: {"features": [...], "old_hash": ...}
    acceptance: AcceptanceConfig = field(default_factory=AcceptanceConfig)
    quiet: bool = False
    routing_skew: float | None = None        # slow tier's power-law exponent (None: the default, 0: uniform)
    routing_histogram: str | None = None     # or a file of measured per-expert loads
    weights: str | None = None               # a checkpoint both tiers load (its routers kept)
    llm_budget_usd: float | None = None      # the LLM agents' dollar budget for the run (all of them)
    llm_budget_tokens: int | None = None     # ... and token budget (None: no limit)
    ttft_ms: float | None = None             # the deployment's SLO per request (None: no bound): the config
    tpot_ms: float | None = None             # search's goodput and the parallelism layout's objective


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


def open_run_log(out: str, run_id: Any) -> logging.Handler | None:
    """``<out>/logs/run-<id>.log``: what the run's loggers (``tkcc.*``) say, a line each as it happens (a crash
    keeps what was said): the engines' start-up stages and restarts, every executor that died and why (the
    judges' own lines, ``Supervisor._forward_engine_lines``), board failures. ``close_run_log`` detaches it.
    None (the run goes on without it) when the file cannot be opened."""
    path = os.path.join(out, "logs", f"run-{getattr(run_id, 'id', run_id)}.log")
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        handler = logging.FileHandler(path, encoding="utf-8")
    except OSError as e:
        log.warning("no run log at %s: %s", path, e)
        return None
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
    handler.setLevel(logging.INFO)
    root = logging.getLogger("tkcc")
    if root.getEffectiveLevel() > logging.INFO:
        root.setLevel(logging.INFO)
    root.addHandler(handler)
    return handler


def close_run_log(handler: logging.Handler | None) -> None:
    if handler is not None:
        logging.getLogger("tkcc").removeHandler(handler)
        handler.close()
