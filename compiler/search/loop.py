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
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from persistent_engine import WorkloadPoint

from compiler.search import config_plan
from compiler.search import inputs
from compiler.plan import artifact as plan_mod
from compiler.search import startup_estimate
from compiler.search.acceptance import AcceptanceConfig, Accepted, Acceptor, Composition
from compiler.search.baseline import measure_noise, op_ms
from compiler.search.budget import Budget
from compiler.plan.buckets import UNBOUNDED
from compiler.plan.compose import Part, compose, select_compatible
from compiler.search.judging import Judge, per_agent, release_agents, report_agents, run_swarm
from compiler.search.memory import RunMemory, shape_class
from compiler.plan.writer import write_plan
from compiler.search.progress import Progress
from compiler.search.recover import mark_recovered, recovered_seeds
from compiler.search.run_state import (Baseline, OptimizeConfig, Outcome, RunContext, RunInputs, StartedEngines,
                                       best_effort, close_run_log, open_run_log)
from compiler.search.tally import accepted_by_author, tally_of
from compiler.search.throughput import DeviceClock

if TYPE_CHECKING:
    from bulletin_board import BoardAPI
    from compiler.fleet.local import Fleet


@dataclass(frozen=True)
class OptimizeResult:
    plan_dir: Path
    plan: plan_mod.Plan
    interrupted: bool


def make_agents(spec: str, device: str, llm_budget_usd: float | None = None,
                llm_budget_tokens: int | None = None) -> list[Any]:
    """``offline:4`` / ``anthropic:2,offline:2`` -> agent instances; the LLM ones share one budget."""
    from compiler.search.agent_spec import build_agents
    shared = None
    if any(k.strip().split(":")[0] in ("anthropic", "openai") for k in spec.split(",")):
        from agents.llm import SharedSpend
        shared = SharedSpend(llm_budget_usd, llm_budget_tokens)
    return build_agents(spec, device, llm_budget=shared)


def start_fleet(cfg: OptimizeConfig, fleet_cfg: Any) -> Fleet:
    if cfg.fleet == "ray":
        from compiler.fleet.ray_fleet import RayFleet
        return RayFleet(fleet_cfg, address=cfg.ray_address).start()
    if cfg.fleet != "local":
        raise inputs.InputError(f"--fleet must be local or ray, got {cfg.fleet!r}")
    from compiler.fleet.local import LocalFleet
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
    """The accepted candidates of runs into this root that wrote no plan become seeds (compiler.search.recover);
    returns the config and the ids of those runs (marked once this run exists)."""
    if not cfg.continue_plan:
        return cfg, []
    lost, dead = best_effort(recovered_seeds, board, cfg.model, cfg.hw, cfg.seeds) or ([], [])
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
    """Runs the whole loop and writes the next plan version under ``cfg.out``: gather the inputs, open the
    run on the board, run the engines' phases (start, baseline, seeds, search, compose), write the plan."""
    t_start = time.monotonic()
    budget = Budget(cfg.wall_s, t_start)
    run_in = gather_inputs(cfg)
    agents = make_agents(cfg.agents, run_in.device["kind"], cfg.llm_budget_usd, cfg.llm_budget_tokens)
    startup_s = budget.startup_timeout(900.0)    # before the board: a budget too short to start writes nothing
    startup_check(cfg, run_in, budget)           # ... and one this machine cannot start the engines in
    run = open_run(cfg, run_in, budget, t_start)
    run_log = open_run_log(cfg.out, run.run_id)
    run.progress.start()
    try:
        with _Interrupt(run.stop, run.progress):
            outcome = run_engines(run, run_in, agents, startup_s)
            vdir = write_plan(run, run_in, outcome)
    except BaseException as e:
        best_effort(run.board.update_run, run.run_id, status="interrupted" if isinstance(e, KeyboardInterrupt)
                    else "failed", message=f"{type(e).__name__}: {e}"[:500])
        raise
    finally:
        run.progress.close()
        close_run_log(run_log)
    written, _ = plan_mod.load(vdir)
    return OptimizeResult(vdir, written, outcome.interrupted)


def gather_inputs(cfg: OptimizeConfig) -> RunInputs:
    """Model, device, traffic and its points, tiers, the tiers' inputs and the cost model's layout."""
    from persistent_engine.models.spec import ModelSpec

    spec = ModelSpec.from_name(cfg.model)
    device = inputs.detect_device(cfg.device)
    hw_doc = inputs.validate_hw(cfg.hw)
    traffic = inputs.read_traffic(cfg.traffic, spec, cfg.hw, max_points=cfg.max_points)
    gpus = cfg.gpus or (len(device["devices"]) if device["kind"] == "cuda" else 1)
    notes: list[str] = [spec.extra["text_only"]] if spec.extra.get("text_only") else []   # models/wrappers.py
    fast_layers, slow_layers = inputs.tier_layers(spec, cfg.fast_layers, cfg.slow_layers,
                                                  device_bytes=inputs.device_memory(device),
                                                  shared=len(device["devices"]) < 2, notes=notes)
    if device["kind"] == "cpu":
        notes.append(inputs.INTERPRETER_NOTE)
    weights = cfg.weights or inputs.checkpoint_weights(cfg.model, notes)     # --model DIR: its own weights
    tier_inputs = inputs.tier_inputs(spec, traffic.summary, cfg.routing_skew, cfg.routing_histogram, weights,
                                     inputs.traffic_token_ids(cfg.traffic, spec.vocab_size))
    layout, projected, layout_note = inputs.parallelism(spec, cfg.hw, traffic.profile, gpus, cfg.ttft_ms, cfg.tpot_ms)
    device = {**device, "matches_hw": inputs.hw_matches(cfg.hw, device), "target": hw_doc}
    return RunInputs(spec, device, traffic, list(traffic.points), fast_layers, slow_layers,
                     tier_inputs, layout, projected, layout_note, tuple(notes))


def open_run(cfg: OptimizeConfig, run_in: RunInputs, budget: Budget, t_start: float) -> RunContext:
    """The progress display, the board and the run's row on it (continuing from the plan root's newest
    version and recovering lost accepted candidates as seeds), and the run's memory of verdicts."""
    deadline = min(t_start + cfg.budget_s, budget.end)
    progress = Progress(deadline, quiet=cfg.quiet, started=t_start)
    device = run_in.device
    for note in run_in.notes:
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
    traffic_hash = run_in.traffic.hash
    deployment_hash = deployment_hash_of(out, cfg.parent_version, traffic_hash)
    run_id = board.create_run(model=cfg.model, hw=cfg.hw, traffic_hash=traffic_hash, deployment_hash=deployment_hash,
                              config={"budget_s": cfg.budget_s, "agents": cfg.agents, "traffic": cfg.traffic,
                                      "device": device["kind"], "device_name": device.get("name"),
                                      "matches_hw": device["matches_hw"], "parent_version": cfg.parent_version,
                                      "slo": {"ttft_ms": cfg.ttft_ms, "tpot_ms": cfg.tpot_ms}})
    if dead:
        best_effort(mark_recovered, board, dead, run_id)
    if cfg.drift is not None:                    # recompile: the drift check that triggered this run
        deployment = best_effort(board.deployment, cfg.model, cfg.hw, deployment_hash)
        best_effort(board.add_drift_event, deployment, True,
                    cfg.drift.get("features", []), run=run_id, old_hash=cfg.drift.get("old_hash", ""),
                    new_hash=traffic_hash)
    progress.on_change = _board_mirror(board, run_id)
    memory = RunMemory(board, run_id, model=cfg.model, hw=cfg.hw,
                       traffic_hash=config_plan.replay_key(traffic_hash, cfg.ttft_ms, cfg.tpot_ms),
                       shape=shape_class(device["kind"], run_in.spec.dtype, run_in.points, run_in.fast_layers,
                                         run_in.slow_layers))
    return RunContext(cfg, board, board_url, run_id, memory, progress, threading.Event(), budget, t_start,
               deployment_hash=deployment_hash)


def deployment_hash_of(out: Path, parent_version: int | None, traffic_hash: str) -> str:
    """The traffic hash that names a run's deployment: its parent version's (a recompile on drifted traffic or
    a continued run stays one deployment, versions under it; ``plan.run.deployment_hash``, else that version's
    own traffic hash), or this run's traffic hash for a root's first version."""
    if parent_version is None:
        return traffic_hash
    try:
        parent = plan_mod.load(out / f"v{parent_version}")[0]
    except (plan_mod.PlanError, OSError):
        return traffic_hash
    return str(parent.run.get("deployment_hash") or parent.traffic.get("hash") or traffic_hash)


def run_engines(run: RunContext, run_in: RunInputs, agents: list[Any], startup_s: float) -> Outcome:
    """The phases on the fleet: start it, measure the baseline, re-verify the seeds, search, compose;
    the fleet and the agents are released whatever happens."""
    progress, cfg = run.progress, run.cfg
    progress.phase("starting")
    engines = start_engines(run, run_in, startup_s)
    fleet = engines.fleet
    try:
        if cfg.fleet == "ray":                   # agents as actors too (the cluster is up now)
            from compiler.fleet.ray_agents import remote_agents
            agents = remote_agents(cfg.agents, len(agents), run_in.device["kind"], run.board_url)
        progress.phase("baseline")
        baseline = measure_baseline(run, fleet, run_in.points)
        # budget_s: the search's; within a run's budget it runs until only the judge's closing time is left
        deadline = min(time.monotonic() + cfg.budget_s, run.budget.compose_end)
        progress.deadline = run.budget.end if cfg.wall_s is not None else deadline
        judge, agents = start_judging(run, run_in, fleet, baseline, agents)
        judge.search_end, judge.confirm_end = deadline, fleet.deadline
        judge.extend_from = run.budget.search_end
        reverify_seeds(judge, cfg.seeds, run.stop)
        swarm = search(run, run_in, judge, engines.clock, agents, baseline.profile, deadline)
        judge.confirm_owed()                 # fast-tier winners the search's end left unconfirmed
        progress.phase("composing")
        composition, interrupted = compose_accepted(run, judge.acceptor)
        tally = tally_of(progress.snapshot().to_dict(), judge.acceptor, composition)
        progress.settle(tally)
        reports = per_agent(swarm, accepted_by_author(judge.acceptor))
        report_agents(run.board, run.run_id, reports, progress)
    finally:
        restarts = fleet.restarts()
        release_agents(agents)
        fleet.close()
        progress.restarts_from(lambda: restarts)
    return Outcome(baseline, composition, judge.accepted, judge.tried, interrupted, restarts, reports,
                   tier_info=engines.tier_info, clock=engines.clock, tally=tally)


def startup_key(cfg: OptimizeConfig, run_in: RunInputs) -> str:
    return startup_estimate.key(cfg.model, run_in.device, run_in.fast_layers, run_in.slow_layers, cfg.weights)


def startup_check(cfg: OptimizeConfig, run_in: RunInputs, budget: Budget) -> float:
    """The engines' estimated start-up (``compiler/search/startup_estimate.py``); ``StartupTooSlow`` (exit 2) when the
    budget leaves less."""
    from compiler.fleet.local import slice_weight_bytes

    text = f"{budget.wall_s / 60:g}m" if budget.wall_s and budget.wall_s % 60 == 0 else f"{budget.wall_s or 0:g}s"
    tiers = [slice_weight_bytes(cfg.model, tuple(t), "bf16") for t in (run_in.fast_layers, run_in.slow_layers)]
    return startup_estimate.check(budget, text, startup_key(cfg, run_in), run_in.device["kind"], tiers)


def start_engines(run: RunContext, run_in: RunInputs, startup_s: float) -> StartedEngines:
    """The fleet, started once within the budget, its device clock, and each tier's inputs and measured
    routing (the tiers' calibrated layer-level bounds as progress lines)."""
    from compiler.fleet.local import FleetConfig

    fleet_cfg = FleetConfig(model=run.cfg.model, points=tuple(run_in.points), fast_layers=tuple(run_in.fast_layers),
                            slow_layers=tuple(run_in.slow_layers), devices=tuple(run_in.device["devices"]),
                            timeout_s=run.cfg.timeout_s, inputs=run_in.tier_inputs, start_timeout_s=startup_s)
    tier_info = {t: {"inputs": inputs.inputs_summary(v)} for t, v in run_in.tier_inputs.items()}
    fleet = _start_within(run.cfg, fleet_cfg, run.budget, startup_key(run.cfg, run_in))
    clock = DeviceClock(fleet).install()        # compiler/search/throughput.py: where the engines' time goes
    fleet.deadline = run.budget.compose_end      # no evaluation runs past the composition's end
    run.progress.restarts_from(fleet.restarts)
    for d in fleet.describe():          # persistent_engine/verification/tolerance.py: each tier's calibrated bound
        if "routing" in d:              # the routing the tier's routers produce (routing.py)
            tier_info[d["tier"]]["routing"] = d["routing"]
            run.progress.event(routing_line(d["tier"], d["routing"]))
        if "logit_bound" in d:
            run.progress.event(f"{d['tier']} engine ({d['device']}, layers {d['layers']}): layer-level logits "
                               f"bound {d['logit_bound'][0]:.3g}-{d['logit_bound'][1]:.3g}")
    return StartedEngines(fleet, clock, tier_info)


def measure_baseline(run: RunContext, fleet: Fleet, points: list[WorkloadPoint]) -> Baseline:
    """The fast tier's per-op profile (posted on the board) and each tier's A/A timing noise."""
    profile = fleet.profile("fast")
    best_effort(run.board.set_baseline, run.run_id, profile)
    took: dict[str, list[float]] = {}

    def timed(tier: str, source: str) -> Any:
        t0 = time.monotonic()
        try:
            return fleet.evaluate(tier, source)
        finally:
            took.setdefault(tier, []).append(time.monotonic() - t0)

    noise = {"fast": 0.05, "slow": 0.05} if run.stop.is_set() else \
        measure_noise(timed, run.cfg.aa_runs, run.progress.event, run.budget.baseline_end())
    run.progress.event(f"baseline profiled; measured noise fast ±{100 * noise['fast']:.1f}% "
                       f"slow ±{100 * noise['slow']:.1f}%")
    noise.update(_longer_samples(run, fleet, noise, timed))
    if max(noise.values()) > 0.25:
        run.progress.event("warning: timing noise above 25% (a busy machine?); only large gains can be accepted")
    eval_s = {tier: sorted(got)[len(got) // 2] for tier, got in took.items()}   # the confirmations' estimate
    return Baseline(profile, op_ms(profile, points), noise, eval_s)


# a tier whose A/A spread is above this times NOISY_SAMPLES x the default sample pairs from then on, and its
# noise is measured again with them: on this 2-core CPU the demo's slow tier measured ±6.3% (threshold 1.063x,
# its candidates at 1.03-1.06x, nothing accepted), with 3x the pairs ±3.7% and two kernels accepted (1.199x plan)
NOISY = 0.03
NOISY_SAMPLES = 3


def _longer_samples(run: RunContext, fleet: Fleet, noise: dict[str, float], timed: Callable) -> dict[str, float]:
    """The noise of each tier measured above ``NOISY`` again, with ``NOISY_SAMPLES`` x the sample pairs (kept
    for the run's A/Bs on that tier) when the fleet can lengthen them and the baseline's time allows: the
    spread under the longer samples, which every later A/B of the tier uses, is its noise. Not with
    ``--aa-runs 1`` (the quickest baseline): its noise is one draw, too little to triple every later A/B on
    (a CI run's continued config search then took 69 s of baseline and 42 s per evaluation)."""
    lengthen = getattr(fleet, "lengthen_samples", None)
    noisy = tuple(t for t, n in noise.items() if n > NOISY)
    if (lengthen is None or not noisy or run.cfg.aa_runs < 2 or run.stop.is_set()
            or time.monotonic() >= run.budget.baseline_end()):
        return {}
    counts = {t: lengthen(t, NOISY_SAMPLES) for t in noisy}
    again = measure_noise(timed, run.cfg.aa_runs, run.progress.event, run.budget.baseline_end(), tiers=noisy)
    run.progress.event("noisy tier(s) timed with longer samples: " + ", ".join(
        f"{t} {counts[t]} pairs, noise ±{100 * again[t]:.1f}% (was ±{100 * noise[t]:.1f}%)" for t in noisy))
    return again


def start_judging(run: RunContext, run_in: RunInputs, fleet: Fleet, baseline: Baseline,
                  agents: list[Any]) -> tuple[Judge, list[Any]]:
    """The acceptor (with the config search's settings plan, compiler/search/config_plan.py) behind a ``Judge``
    for every candidate; the agents seeded from the run's memory."""
    progress = run.progress

    def on_accept(a: Accepted) -> None:
        progress.accepted(a.slow)
        progress.event(f"accepted {a.name}: fast {a.fast:.3f}x, slow {a.slow:.3f}x")

    accepted: list[Accepted] = []
    acceptor = Acceptor(fleet.evaluate, run_in.points, baseline.noise, run.cfg.acceptance, on_accept, accepted)
    acceptor, agents = config_plan.start(acceptor, agents, run.cfg.traffic, baseline.profile, run_in.spec,
                                         run_in.fast_layers, run_in.device["kind"], on_accept, progress.event,
                                         slo=config_plan.slo_of(run.cfg.ttft_ms, run.cfg.tpot_ms))
    run.memory.seed(agents)
    return Judge(run, fleet, acceptor, accepted, eval_s=dict(baseline.eval_s)), agents


def reverify_seeds(judge: Judge, seeds: tuple[tuple[str, str], ...], stop: threading.Event) -> None:
    """Recompile / continue: the old plan's optimizations are judged first."""
    for name, source in seeds:
        if stop.is_set():
            break
        judge.consider(source, author=plan_mod.seed_author(name))


def search(run: RunContext, run_in: RunInputs, judge: Judge, clock: DeviceClock, agents: list[Any], profile: dict,
           deadline: float) -> Any:
    """The agents' search until ``deadline`` (unless stopped); returns the swarm's result (None: no search)."""
    if run.stop.is_set() or time.monotonic() >= deadline:
        return None
    run.progress.phase("searching")
    timed_on = "cpu" if run_in.device["kind"] == "cpu" else run.cfg.hw       # the roofline's hardware
    clock.open()
    swarm = run_swarm(judge, agents, run_in, profile, deadline, hw=timed_on)
    clock.close()
    return swarm


def compose_accepted(run: RunContext, acceptor: Acceptor) -> tuple[Composition | None, bool]:
    """(composition, interrupted): re-verified and re-measured, with PDL plan-wide where it pays and its bucket
    variants, or after Ctrl-C composed unmeasured."""
    interrupted = run.stop.is_set()
    if interrupted:
        composition = _unmeasured(acceptor.accepted)
    else:
        deadline = min(time.monotonic() + max(60.0, 0.1 * run.cfg.budget_s), run.budget.compose_end)
        composition = acceptor.compose(deadline=deadline)
        if composition is not None and composition.parts and not run.stop.is_set():
            composition = acceptor.plan_wide_pdl(composition, deadline=deadline)
            if composition.pdl:
                run.progress.event(f"plan-wide PDL kept: slow {composition.slow:.3f}x")
            composition = acceptor.bucket_variants(composition, deadline=deadline)
            for lo, hi, v in composition.variants:
                run.progress.event(f"variant for decode batches {lo}-{hi if hi < UNBOUNDED else ''}: "
                                   f"{', '.join(a.name for a in v.parts) or 'the reference'}")
    interrupted = run.stop.is_set()              # a Ctrl-C during composition counts too
    return composition, interrupted


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


def _start_within(cfg: OptimizeConfig, fleet_cfg: Any, budget: Budget, key: str) -> Fleet:
    """The fleet, started within the run's budget; engines not ready in time end the run (one line). The
    seconds to ready are recorded for the next run's estimate (or, not ready in time, as a lower bound)."""
    from persistent_engine import EngineStartError
    t0 = time.monotonic()
    try:
        fleet = start_fleet(cfg, fleet_cfg)
    except EngineStartError as e:
        if budget.wall_s is not None and budget.left(budget.search_end) <= 1.0:
            startup_estimate.record(key, time.monotonic() - t0, ready=False)
            raise budget.not_started(fleet_cfg.start_timeout_s, e) from None
        raise
    startup_estimate.record(key, time.monotonic() - t0)
    return fleet


def routing_line(tier: str, r: dict) -> str:
    """One progress line on a tier's measured MoE routing (``persistent_engine.routing.RoutingStats``)."""
    from persistent_engine import RoutingSpec

    spec = RoutingSpec.from_dict(r.get("spec")).label()
    top = r.get("top1_share") or [0.0]
    tie = r.get("near_tie_share") or [0.0]
    return (f"{tier} tier routing: {spec}; hottest expert {100 * min(top):.1f}-{100 * max(top):.1f}% of assignments, "
            f"near-ties {100 * min(tie):.1f}-{100 * max(tie):.1f}% of tokens per MoE layer")


def _board_mirror(board: BoardAPI, run_id: Any) -> Callable[[Any], None]:
    """Mirrors the progress counters to the run's row (at most once a second)."""
    last = [0.0, ""]

    def mirror(snap: Any) -> None:
        now = time.monotonic()
        if now - last[0] < 1.0 and snap.phase == last[1]:
            return
        last[0], last[1] = now, snap.phase
        best_effort(board.update_run, run_id, message=snap.phase, candidates_tried=snap.tried,
                    candidates_accepted=snap.accepted, best_speedup=snap.best_speedup,
                    engine_restarts=snap.restarts)
    return mirror
