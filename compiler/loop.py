"""The optimize loop (DESIGN.md "The loop"): traffic -> workload points; cost model -> layout and
projections; fleet started once; baseline measured, profiled and posted; the swarm for the budget
with every fast-tier verdict screened and confirmed on the slow tier; accepted overrides composed,
re-verified and re-measured; the plan and report written.

Ctrl-C (SIGINT) sets the stop event: the agents finish their cycle, nothing new starts, and the
plan of what was accepted so far is written (composed but not re-measured, and marked
``interrupted``). A second Ctrl-C aborts (the plan directory is written atomically, so an abort
leaves no half-written plan).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import logging
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TYPE_CHECKING

from compiler import config_plan, inputs, plan as plan_mod, report
from compiler.acceptance import AcceptanceConfig, Accepted, Acceptor, Composition
from compiler.baseline import _identity_candidate, measure_noise, op_ms  # noqa: F401 - tests import them here
from compiler.budget import Budget
from compiler.compose import Part, compose, select_compatible
from compiler.isolated import run_isolated
from compiler.memory import RunMemory, shape_class
from compiler.throughput import DeviceClock, run_fields
from compiler.recover import mark_recovered, recovered_seeds
from compiler.progress import Progress

if TYPE_CHECKING:
    from bulletin_board import BoardAPI
    from compiler.fleet import Fleet

log = logging.getLogger("tkcc.loop")
# the plan's per-op profile and its torch.compile comparison run in a child process (compiler.isolated);
# past this they are left out of the plan (they are optional, the plan is not)
ISOLATED_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class OptimizeConfig:
    model: str
    hw: str
    traffic: str
    out: str
    budget_s: float = 600.0                  # the agents' search time (after the baseline)
    wall_s: float | None = None              # the whole run's bound (compiler/budget.py); None: unbounded
    agents: str = "offline:4"
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


@dataclass(frozen=True)
class OptimizeResult:
    plan_dir: Path
    plan: plan_mod.Plan
    interrupted: bool


def make_agents(spec: str, device: str, llm_budget_usd: float | None = None,
                llm_budget_tokens: int | None = None) -> list[Any]:
    """``offline:4`` / ``anthropic:2,offline:2`` -> agent instances; the LLM ones share one budget."""
    from compiler.agent_spec import build_agents
    shared = None
    if any(k.strip().split(":")[0] in ("anthropic", "openai") for k in spec.split(",")):
        from agents.llm import SharedSpend
        shared = SharedSpend(llm_budget_usd, llm_budget_tokens)
    return build_agents(spec, device, llm_budget=shared)


def start_fleet(cfg: OptimizeConfig, fleet_cfg: Any) -> Fleet:
    if cfg.fleet == "ray":
        from compiler.ray_fleet import RayFleet
        return RayFleet(fleet_cfg, address=cfg.ray_address).start()
    if cfg.fleet != "local":
        raise inputs.InputError(f"--fleet must be local or ray, got {cfg.fleet!r}")
    from compiler.fleet import LocalFleet
    return LocalFleet(fleet_cfg).start()


class _Interrupt:
    """First SIGINT: set ``stop``; second: KeyboardInterrupt. Installed only on the main thread."""

    def __init__(self, stop: threading.Event, progress: Progress):
        self.stop, self.progress, self.hits = stop, progress, 0
        self._old: Any = None

    def __enter__(self) -> "_Interrupt":
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.hits += 1
        if self.hits > 1:
            raise KeyboardInterrupt
        self.stop.set()
        self.progress.event("interrupted: finishing the current candidates and writing the plan of "
                            "what was accepted (Ctrl-C again to abort)")

    def __exit__(self, *exc: Any) -> None:
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)


def _recovered(cfg: OptimizeConfig, board: BoardAPI, progress: Progress) -> tuple[OptimizeConfig, list]:
    """The accepted candidates of runs into this root that wrote no plan become seeds (compiler.recover);
    returns the config and the ids of those runs (marked once this run exists)."""
    if not cfg.continue_plan:
        return cfg, []
    lost, dead = _best_effort(recovered_seeds, board, cfg.model, cfg.hw, cfg.seeds) or ([], [])
    if lost:
        progress.event(f"recovered {len(lost)} accepted candidate(s) of runs that wrote no plan; "
                       "they are re-verified first")
        cfg = dataclasses.replace(cfg, seeds=tuple(cfg.seeds) + tuple(lost))
    return cfg, dead


def continued(cfg: OptimizeConfig, out: Path, progress: Progress | None = None) -> OptimizeConfig:
    """A run into a plan root that already holds a version for the same model and hardware continues
    from the newest one: its optimizations are re-verified first (as ``recompile`` does, so they must
    still hold on this traffic and engine) and it becomes the new version's parent. Short runs thus
    accumulate instead of starting over. Unchanged when seeds are given, ``continue_plan`` is off, or
    the root holds no usable version."""
    if cfg.seeds or not cfg.continue_plan or not plan_mod.versions(out):
        return cfg
    try:
        prev, vdir = plan_mod.load(out)
        seeds = plan_mod.seeds_of(prev, vdir)
    except (plan_mod.PlanError, OSError) as e:
        if progress is not None:             # e.g. a kernel edited after it was written: never a seed
            progress.event(f"warning: not continuing from the plan in {out}: {e}")
        return cfg
    if prev.model != cfg.model or prev.hw != cfg.hw:
        return cfg
    if progress is not None:
        progress.event(f"continuing from {vdir}: its {len(seeds)} optimization(s) are re-verified first, unless "
                       "remembered for this workload "
                       "(--fresh starts over)")
    return dataclasses.replace(cfg, seeds=seeds, parent_version=cfg.parent_version or prev.version)


def optimize(cfg: OptimizeConfig) -> OptimizeResult:
    """Runs the whole loop and writes the next plan version under ``cfg.out``."""
    from persistent_engine.models.spec import ModelSpec

    t_start = time.monotonic()
    budget = Budget(cfg.wall_s, t_start)
    deadline = min(t_start + cfg.budget_s, budget.end)
    spec = ModelSpec.from_name(cfg.model)
    device = inputs.detect_device(cfg.device)
    hw_doc = inputs.validate_hw(cfg.hw)
    traffic = inputs.read_traffic(cfg.traffic, spec, cfg.hw, max_points=cfg.max_points)
    points = [dict(p) for p in traffic.points]
    gpus = cfg.gpus or (len(device["devices"]) if device["kind"] == "cuda" else 1)
    tier_notes: list[str] = []
    fast_layers, slow_layers = inputs.tier_layers(spec, cfg.fast_layers, cfg.slow_layers,
                                                  device_bytes=inputs.device_memory(device),
                                                  shared=len(device["devices"]) < 2, notes=tier_notes)
    tier_inputs = inputs.tier_inputs(spec, traffic.summary, cfg.routing_skew, cfg.routing_histogram, cfg.weights,
                                     inputs.traffic_token_ids(cfg.traffic, spec.vocab_size))
    layout, projected, layout_note = inputs.parallelism(spec, cfg.hw, traffic.profile, gpus)
    device = {**device, "matches_hw": inputs.hw_matches(cfg.hw, device), "target": hw_doc}
    agents = make_agents(cfg.agents, device["kind"], cfg.llm_budget_usd, cfg.llm_budget_tokens)
    startup_s = budget.startup_timeout(900.0)    # before the board: a budget too short to start writes nothing

    stop = threading.Event()
    progress = Progress(deadline, quiet=cfg.quiet, started=t_start)
    for note in tier_notes:                      # tiers shrunk to fit this device's memory
        progress.event(note)
    if not device["matches_hw"]:
        progress.event(f"target --hw {cfg.hw} differs from the detected device {device['name']} "
                       f"({device['kind']}): measuring on {device['kind']}, projecting for {cfg.hw}; both recorded")

    from compiler.validate import board_url as checked_board_url, open_board
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = continued(cfg, out, progress)
    board_url = checked_board_url(cfg.board or f"sqlite:///{(out / 'board.db').resolve()}")
    board = open_board(board_url)
    cfg, dead = _recovered(cfg, board, progress)
    run_id = board.create_run(model=cfg.model, hw=cfg.hw, traffic_hash=traffic.hash,
                              config={"budget_s": cfg.budget_s, "agents": cfg.agents, "traffic": cfg.traffic,
                                      "device": device["kind"], "parent_version": cfg.parent_version})
    if dead:
        _best_effort(mark_recovered, board, dead, run_id)
    if cfg.drift is not None:                    # recompile: the drift check that triggered this run
        deployment = _best_effort(board.deployment, cfg.model, cfg.hw, traffic.hash)
        _best_effort(board.add_drift_event, deployment, True,
                     cfg.drift.get("features", []), run=run_id, old_hash=cfg.drift.get("old_hash", ""),
                     new_hash=traffic.hash)
    progress.on_change = _board_mirror(board, run_id)
    memory = RunMemory(board, run_id, model=cfg.model, hw=cfg.hw, traffic_hash=traffic.hash,
                       shape=shape_class(device["kind"], spec.dtype, points, fast_layers, slow_layers))

    from compiler.fleet import FleetConfig
    fleet_cfg = FleetConfig(model=cfg.model, points=tuple(points), fast_layers=tuple(fast_layers),
                            slow_layers=tuple(slow_layers), devices=tuple(device["devices"]),
                            timeout_s=cfg.timeout_s, inputs=tier_inputs, start_timeout_s=startup_s)
    tier_info = {t: {"inputs": inputs.inputs_summary(v)} for t, v in tier_inputs.items()}
    interrupted = False
    accepted_log: list[Accepted] = []
    baseline: dict = {}
    noise: dict[str, float] = {}
    composition: Composition | None = None
    agent_reports: list[dict] = []
    tried = [0]
    progress.start()
    try:
        with _Interrupt(stop, progress):
            progress.phase("starting")
            fleet = _start_within(cfg, fleet_cfg, budget)
            clock = DeviceClock(fleet).install()        # compiler/throughput.py: where the engines' time goes
            fleet.deadline = budget.compose_end          # no evaluation runs past the composition's end
            progress.restarts_from(fleet.restarts)
            for d in fleet.describe():          # persistent_engine/tolerance.py: each tier's calibrated bound
                if "routing" in d:              # the routing the tier's routers produce (routing.py)
                    tier_info[d["tier"]]["routing"] = d["routing"]
                    progress.event(routing_line(d["tier"], d["routing"]))
                if "logit_bound" in d:
                    progress.event(f"{d['tier']} engine ({d['device']}, layers {d['layers']}): layer-level logits "
                                   f"bound {d['logit_bound'][0]:.3g}-{d['logit_bound'][1]:.3g}")
            try:
                if cfg.fleet == "ray":                   # agents as actors too (the cluster is up now)
                    from compiler.ray_agents import remote_agents
                    agents = remote_agents(cfg.agents, len(agents), device["kind"], board_url)
                progress.phase("baseline")
                base_profile = fleet.profile("fast")
                baseline = {"profile": base_profile, "op_ms": op_ms(base_profile, points)}
                _best_effort(board.set_baseline, run_id, base_profile)
                noise = {"fast": 0.05, "slow": 0.05} if stop.is_set() else \
                    measure_noise(fleet.evaluate, cfg.aa_runs, progress.event, budget.baseline_end())
                progress.event(f"baseline profiled; measured noise fast ±{100 * noise['fast']:.1f}% "
                               f"slow ±{100 * noise['slow']:.1f}%")
                if max(noise.values()) > 0.25:
                    progress.event("warning: timing noise above 25% (a busy machine?); only large gains can be accepted")
                deadline = min(time.monotonic() + cfg.budget_s, budget.search_end)   # budget_s: the search's
                progress.deadline = budget.end if cfg.wall_s is not None else deadline

                def on_accept(a: Accepted) -> None:
                    progress.accepted(a.slow)
                    progress.event(f"accepted {a.name}: fast {a.fast:.3f}x, slow {a.slow:.3f}x")

                acceptor = Acceptor(fleet.evaluate, points, noise, cfg.acceptance, on_accept, accepted_log)
                acceptor, agents = config_plan.start(acceptor, agents, cfg.traffic, base_profile, spec, fast_layers,
                                                     device["kind"], on_accept, progress.event)
                memory.seed(agents)
                for name, source in cfg.seeds:               # recompile: the old plan's optimizations first
                    if stop.is_set():
                        break
                    _consider(board, run_id, fleet, acceptor, progress, source, author=f"seed:{name}", tried=tried,
                              memory=memory)

                if not stop.is_set() and time.monotonic() < deadline:
                    progress.phase("searching")
                    timed_on = "cpu" if device["kind"] == "cpu" else cfg.hw       # the roofline's hardware
                    clock.open()
                    swarm = _run_swarm(cfg, agents, board, run_id, fleet, acceptor, progress, spec, points,
                                       base_profile, deadline, stop, tried, hw=timed_on, memory=memory)
                    clock.close()
                    agent_reports = per_agent(swarm, accepted_log)
                    _report_agents(board, run_id, agent_reports, progress)
                interrupted = stop.is_set()
                progress.phase("composing")
                if interrupted:
                    composition = _unmeasured(acceptor.accepted)
                else:
                    composition = acceptor.compose(deadline=min(time.monotonic() + max(60.0, 0.1 * cfg.budget_s),
                                                                budget.compose_end))
                interrupted = stop.is_set()              # a Ctrl-C during composition counts too
                if composition is not None:
                    progress.event(f"composition: kept {len(composition.parts)} of {len(acceptor.accepted)} accepted"
                                   + dropped_summary(composition.dropped))
            finally:
                restarts = fleet.restarts()
                _release_agents(agents)
                fleet.close()
                progress.restarts_from(lambda: restarts)
            progress.phase("writing")
            # after Ctrl-C the plan is written at once: no per-op profile of the composition
            after = {} if interrupted else _op_ms_after(
                spec, fast_layers, points, composition, device, baseline,
                _isolated_time(budget, progress, "the per-op profile of the plan"))
            if cfg.vs_torch_compile and composition is not None and composition.parts and not interrupted:
                baseline["torch_compile"] = _vs_torch_compile(
                    spec, slow_layers, points, composition, device, progress,
                    _isolated_time(budget, progress, "the torch.compile comparison"))
            plan = _build_plan(cfg, spec, device, traffic, points, fast_layers, slow_layers, layout, projected,
                               layout_note, baseline, after, noise, composition, accepted_log, interrupted,
                               tried[0], restarts, time.monotonic() - t_start, tier_info,
                               progress.snapshot().phases)
            plan = dataclasses.replace(plan, run={**plan.run, **run_fields(board, run_id, clock, memory.hits, [
                o.to_dict() for o in plan.optimizations if o.projected]),
                                                  **({"agent_reports": agent_reports} if agent_reports else {})})
            sources = {o.kernel: a.source for o, a in zip(plan.optimizations, composition.parts if composition else ())}
            vdir = plan_mod.write_version(out, plan, sources=sources,
                                          composed_source=composition.source if composition else compose([]),
                                          profile=traffic.profile, extra_files=report.render)
            for o, a in zip(plan.optimizations, composition.parts if composition else ()):
                if a.candidate_id is not None:
                    _best_effort(board.add_optimization, run_id, a.candidate_id, name=o.name, targets=list(o.targets),
                                 speedups=o.speedup, per_point=list(o.per_point), plan_version=written_version(vdir))
            progress.phase("done")
            snap = progress.snapshot()
            _best_effort(board.update_run, run_id, status="interrupted" if interrupted else "done",
                         message=f"plan {vdir}", candidates_tried=snap.tried, candidates_accepted=snap.accepted,
                         best_speedup=snap.best_speedup, engine_restarts=restarts)
    except BaseException as e:
        _best_effort(board.update_run, run_id, status="interrupted" if isinstance(e, KeyboardInterrupt)
                     else "failed", message=f"{type(e).__name__}: {e}"[:500])
        raise
    finally:
        progress.close()
    written, _ = plan_mod.load(vdir)
    return OptimizeResult(vdir, written, interrupted)


def _consider(board: BoardAPI, run_id: Any, fleet: Fleet, acceptor: Acceptor, progress: Progress, source: str, *,
              author: str, tried: list[int], idea_id: Any = None, parent: Any = None,
              author_kind: str = "seed", memory: RunMemory | None = None) -> Any:
    """Fast tier, then acceptance (slow tier when it beats the noise); everything goes on the board,
    the candidate with its parent (lineage) and its author's kind ("llm" for LLM-written code). A
    source ``memory`` holds a verdict for is not judged again (compiler/memory.py)."""
    known = memory.recalled(source, acceptor) if memory is not None else None
    if known is not None:
        return known
    cand = _best_effort(board.add_candidate, run_id, author=author, source=source, idea=idea_id,
                        parent=parent, author_kind=author_kind)
    verdict = fleet.evaluate("fast", source)
    tried[0] += 1
    progress.count("tried")
    if getattr(verdict, "correct", False):
        progress.count("correct")
    decision = acceptor.consider(source, verdict, author=author, idea_id=idea_id, candidate_id=cand)
    if decision.stage == "slow":
        progress.count("fast_passed")
    if cand is not None:
        _best_effort(board.add_evaluation, cand, tier="fast", point=None,
                     metrics={"speedup": getattr(verdict, "speedup", None), "per_point": getattr(verdict, "per_point", []),
                             "accepted": bool(decision.accepted),
                             "timings": getattr(verdict, "timings", {}), "decision": decision.reason,
                             "slow_speedup": decision.slow},
                     verdict="correct" if getattr(verdict, "correct", False) else "rejected",
                     reasons=list(getattr(verdict, "reasons", []) or []), device=fleet.cfg.devices[0],
                     versions={}, timing_method="engine A/B")
    if memory is not None:
        memory.remember(source, verdict, decision, acceptor, idea_id=idea_id)
    return verdict


def _run_swarm(cfg: OptimizeConfig, agents: list[Any], board: BoardAPI, run_id: Any, fleet: Fleet,
               acceptor: Acceptor, progress: Progress, spec: Any, points: list[dict], base_profile: dict,
               deadline: float, stop: threading.Event, tried: list[int], hw: str | None = None,
               memory: RunMemory | None = None) -> Any:
    """The agents' search; returns the ``agents.SwarmResult``. ``hw``: the cost-model hardware of the
    timings (the LLM agents' roofline)."""
    from agents import AgentContext, op_catalog, run_swarm

    seen: dict[str, Any] = {}
    lock = threading.Lock()

    def evaluate(source: str, *, author: str, idea_id: Any = None, parent: Any = None,
                 author_kind: str = "") -> Any:
        key = hashlib.sha256(source.encode()).hexdigest()
        with lock:
            if key in seen:                      # the same source is never measured twice
                return seen[key]
        verdict = _consider(board, run_id, fleet, acceptor, progress, source, author=author, tried=tried,
                            idea_id=idea_id, parent=parent, author_kind=author_kind, memory=memory)
        with lock:
            seen[key] = verdict
        return verdict

    ctx = AgentContext(board=board, run_id=run_id, evaluate=evaluate, profile=base_profile, points=points,
                       spec=spec, ops=op_catalog(), deadline=deadline, stop=stop, hw=hw)
    return run_swarm(agents, ctx, max(deadline - time.monotonic(), 0.0))


def per_agent(swarm: Any, accepted: list[Accepted]) -> list[dict]:
    """One row per agent: cycles, candidates tried / correct / accepted (confirmed on both tiers),
    tokens, dollars and why it stopped."""
    by_author: dict[str, int] = {}
    for a in accepted:
        by_author[a.author] = by_author.get(a.author, 0) + 1
    rows = []
    for r in getattr(swarm, "agents", ()):
        u = r.usage
        rows.append({"name": r.name, "cycles": r.cycles, "tried": r.tried, "correct": r.correct,
                     "accepted": by_author.get(r.name, 0), "failures": r.failures,
                     "input_tokens": u.input_tokens, "cached_tokens": u.cached_tokens,
                     "output_tokens": u.output_tokens, "cost_usd": round(u.cost_usd, 6),
                     "requests": u.requests, "stopped": r.stopped})
    return rows


def _report_agents(board: BoardAPI, run_id: Any, rows: list[dict], progress: Progress) -> None:
    """Per-agent accounting into the run's config (the UI shows it), the LLM agents' stopping lines (a
    budget spent) and one line of the LLM spend, as progress events."""
    run = _best_effort(board.get_run, run_id)
    if run is not None:
        _best_effort(board.update_run, run_id, config={**(run.config or {}), "agent_reports": rows})
    stopped = _best_effort(board.list_posts, run_id, kind="stopped", limit=100)
    for post in getattr(stopped, "items", ()):                  # "stopping: the run's LLM budget is spent ..."
        progress.event(f"{post.author}: {post.body}")
    llm = [r for r in rows if r["requests"]]
    if llm:
        progress.event(f"LLM agents: {sum(r['input_tokens'] + r['cached_tokens'] + r['output_tokens'] for r in llm)} "
                       f"tokens, ${sum(r['cost_usd'] for r in llm):.4f}, {sum(r['tried'] for r in llm)} candidates, "
                       f"{sum(r['accepted'] for r in llm)} accepted")


def _release_agents(agents: list[Any]) -> None:
    """Ends agent actors (``--fleet ray``); local agents need nothing."""
    actors = [a.actor for a in agents if hasattr(a, "actor")]
    if actors:
        import ray
        for actor in actors:
            ray.kill(actor)


def written_version(vdir: Path) -> int:
    return int(vdir.name.lstrip("v"))


def _unmeasured(accepted: list[Accepted]) -> Composition | None:
    """After Ctrl-C: compose what was accepted without re-measuring (the plan says so)."""
    if not accepted:
        return None
    ranked = sorted(accepted, key=lambda a: -a.slow)
    kept, _ = select_compatible([Part(a.name, a.source, a.targets, a.config_keys) for a in ranked])
    names = {p.name for p in kept}
    members = tuple(a for a in ranked if a.name in names)
    src = compose([Part(a.name, a.source, a.targets, a.config_keys) for a in members])
    return Composition(members, src, float("nan"), float("nan"), (), (("*", "not re-measured: interrupted"),))


def _start_within(cfg: OptimizeConfig, fleet_cfg: Any, budget: Budget) -> Fleet:
    """The fleet, started within the run's budget; engines not ready in time end the run (one line)."""
    from persistent_engine import EngineStartError
    try:
        return start_fleet(cfg, fleet_cfg)
    except EngineStartError as e:
        if budget.wall_s is not None and budget.left(budget.search_end) <= 1.0:
            raise budget.not_started(fleet_cfg.start_timeout_s, e) from None
        raise


def _isolated_time(budget: Budget, progress: Progress, what: str, least_s: float = 10.0) -> float:
    """Seconds an optional child measurement of the writing phase may take (0: left out, said so)."""
    left = min(ISOLATED_TIMEOUT_S, budget.left() - 3.0)
    if left < least_s:
        progress.event(f"{what} is left out: {max(left, 0):.0f} s of the budget remain")
        return 0.0
    return left


def _op_ms_after(spec: Any, layers: list[int], points: list[dict], composition: Composition | None,
                 device: dict, baseline: dict, timeout_s: float = ISOLATED_TIMEOUT_S) -> dict[str, dict[str, float]]:
    """Per-op time of the fast-tier slice before and after the composed plan, measured the same way
    in a child process (candidate code never runs in the orchestrator; the engine's profile covers the
    reference only)."""
    if composition is None or not composition.parts or timeout_s <= 0:
        return {}
    try:
        from compiler.apply import op_times_with
        return run_isolated(op_times_with, spec, layers, points, composition.source,
                            device="cpu" if device["kind"] == "cpu" else "cuda", timeout_s=timeout_s)
    except Exception as e:  # noqa: BLE001 - the plot is optional; the plan is not
        log.warning("per-op timing with the plan failed: %s", e)
        return {}


def _vs_torch_compile(spec: Any, layers: list[int], points: list[dict], composition: Composition,
                      device: dict, progress: Progress, timeout_s: float = ISOLATED_TIMEOUT_S) -> dict:
    if timeout_s <= 0:
        return {"error": "left out: the run's budget was spent"}
    try:
        from compiler.compare import compare_with_torch_compile
        res = run_isolated(compare_with_torch_compile, spec, layers, points, composition.source,   # a child process
                           device="cpu" if device["kind"] == "cpu" else "cuda", timeout_s=timeout_s)
    except Exception as e:  # noqa: BLE001 - a comparison that fails is recorded, the plan stands
        return {"error": f"{type(e).__name__}: {e}"[:300]}
    left_out = [f"{r['point'].get('phase')} b{r['point'].get('batch')}: {r['error']}" for r in res["points"] if "error" in r]
    progress.event(f"plan ({res['plan_timing']}) vs torch.compile ({res['torch_compile_mode']}) of the slow-tier "
                   f"slice: {res['plan_vs_torch_compile']}x (vs reference eager {res['plan_vs_reference']}x), "
                   f"{100 * res['weight_covered']:.0f}% of the traffic weight"
                   + "".join(f"; left out {p}" for p in left_out))
    return res


def _build_plan(cfg: OptimizeConfig, spec: Any, device: dict, traffic: inputs.TrafficInput, points: list[dict],
                fast_layers: list[int], slow_layers: list[int], layout: dict | None, projected: dict | None,
                layout_note: str, baseline: dict, after: dict, noise: dict, composition: Composition | None,
                accepted: list[Accepted], interrupted: bool, tried: int, restarts: int,
                elapsed_s: float, tier_info: dict | None = None,
                phases: dict | None = None) -> plan_mod.Plan:
    import math

    taken: set[str] = set()
    opts = []
    for a in (composition.parts if composition else ()):
        opts.append(plan_mod.Optimization(
            name=a.name, targets=a.targets, speedup={"fast": round(a.fast, 4), "slow": round(a.slow, 4)},
            per_point=a.per_point, kernel=f"kernels/{plan_mod.kernel_filename(a.name, taken)}",
            author=a.author, description=a.description, noise=a.noise, projected=getattr(a, "projected", None)))

    def num(x: float) -> float | None:
        return None if x is None or not math.isfinite(x) else round(x, 4)

    if composition is None:
        plan_speedup = {"fast": 1.0, "slow": 1.0, "per_point": [], "note": "nothing accepted: the reference"}
    else:
        plan_speedup = {"fast": num(composition.fast), "slow": num(composition.slow),
                        "per_point": list(composition.per_point),
                        "dropped": [list(d) for d in composition.dropped]}
        if interrupted:
            plan_speedup["note"] = "interrupted: composition not re-measured"
        tc = baseline.get("torch_compile") or {}
        if tc.get("plan_vs_torch_compile") is not None:
            plan_speedup["vs_torch_compile"] = tc["plan_vs_torch_compile"]
            plan_speedup["vs_reference_in_process"] = tc["plan_vs_reference"]
    summary_dev = {k: v for k, v in device.items() if k != "target"}
    return plan_mod.Plan(
        model=cfg.model, hw=cfg.hw, detected_device=summary_dev,
        software=inputs.software_versions(),
        traffic={"source": traffic.source, "hash": traffic.hash, "summary": traffic.summary},
        workload_points=tuple(points), optimizations=tuple(opts), plan_speedup=plan_speedup,
        parallelism=layout, projected={**(projected or {}), "label": "projected"} if projected else None,
        tiers={t: {"layers": layers, **(tier_info or {}).get(t, {})}
               for t, layers in (("fast", fast_layers), ("slow", slow_layers))},
        baseline={"op_ms": after.get("before") or baseline.get("op_ms") or {},
                  "op_ms_after": after.get("after") or {}, "noise": noise,
                  "torch_compile": baseline.get("torch_compile"),
                  "profile": baseline.get("profile")},
        run={"budget_s": cfg.budget_s, "wall_s": cfg.wall_s, "phases_s": dict(phases or {}),
             "elapsed_s": round(elapsed_s, 1), "interrupted": interrupted,
             "tried": tried, "accepted": len(accepted), "restarts": restarts, "agents": cfg.agents,
             "fleet": cfg.fleet, "layout_note": layout_note, "origin": _origin(cfg)},
        parent_version=cfg.parent_version,
        created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))


def routing_line(tier: str, r: dict) -> str:
    """One progress line on a tier's measured MoE routing (``persistent_engine.routing.RoutingStats``)."""
    from persistent_engine import RoutingSpec

    spec = RoutingSpec.from_dict(r.get("spec")).label()
    top = r.get("top1_share") or [0.0]
    tie = r.get("near_tie_share") or [0.0]
    return (f"{tier} tier routing: {spec}; hottest expert {100 * min(top):.1f}-{100 * max(top):.1f}% of assignments, "
            f"near-ties {100 * min(tie):.1f}-{100 * max(tie):.1f}% of tokens per MoE layer")


def dropped_summary(dropped: tuple | list, names: int = 3) -> str:
    """"; dropped N: why (a, b, c, ...)" per reason, most frequent first: a 20-minute run drops hundreds
    of superseded variants, one line each would bury the log (the plan keeps the full list)."""
    by_reason: dict[str, list[str]] = {}
    for name, why in dropped:
        by_reason.setdefault(why, []).append(name)
    parts = []
    for why, who in sorted(by_reason.items(), key=lambda kv: -len(kv[1])):
        shown = ", ".join(who[:names]) + (f", +{len(who) - names} more" if len(who) > names else "")
        parts.append(f"; dropped {len(who)}: {why} ({shown})")
    return "".join(parts)


def _origin(cfg: OptimizeConfig) -> str:
    """Why this version exists: "new" (first in its root), "continued" (optimize into an existing root:
    the newest version's optimizations re-verified as seeds), "drift" or "forced" (tkcc recompile)."""
    if cfg.drift is not None:
        return "forced" if cfg.drift.get("forced") else "drift"
    return "continued" if cfg.parent_version is not None else "new"


def _best_effort(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """Board bookkeeping is best effort: a failure is logged and never stops a run."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001
        log.warning("%s failed: %s", getattr(fn, "__name__", fn), e)
        return None


def _board_mirror(board: BoardAPI, run_id: Any) -> Callable[[Any], None]:
    """Mirrors the progress counters to the run's row (at most once a second)."""
    last = [0.0, ""]

    def mirror(snap: Any) -> None:
        now = time.monotonic()
        if now - last[0] < 1.0 and snap.phase == last[1]:
            return
        last[0], last[1] = now, snap.phase
        _best_effort(board.update_run, run_id, message=snap.phase, candidates_tried=snap.tried,
                     candidates_accepted=snap.accepted, best_speedup=snap.best_speedup,
                     engine_restarts=snap.restarts)
    return mirror
