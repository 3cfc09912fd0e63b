"""The fleet: fast-tier and slow-tier engines, started once per run (local processes).

Each engine is a ``persistent_engine.supervisor.Supervisor`` (its own process, restarted after a
crash or a hang). Placement over the available devices:

    N >= 2 GPUs   slow tier on the last GPU, one fast-tier engine on each of the others
    1 GPU / CPU   one fast-tier and one slow-tier engine on the same device

Engines that share a physical device share a *measure lock*, so that two engines never time at the
same moment on one device (concurrent work would pollute both A/B measurements); engines on
different GPUs measure in parallel. ``evaluate(tier, source)`` takes a free engine of the tier and
never raises: an engine that fails outside a candidate's verdict (it died and could not restart)
gives a rejected verdict with the reason, and the next call finds it restarted. A verdict of the judge
process dying is re-tried once on the restarted engine; a crash of the candidate's executor is not (see
:func:`evaluate_with_retry`).

:class:`Fleet` is the interface the optimize loop codes against; :class:`LocalFleet` (here) and
``compiler.fleet.ray_fleet.RayFleet`` implement it, and tests/compiler/test_fleet_contract.py is the one
contract suite run against both.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, runtime_checkable

from persistent_engine import WorkloadPoint, scratch

log = logging.getLogger("tkcc.fleet")


@dataclass(frozen=True)
class FleetConfig:
    model: str
    points: tuple[WorkloadPoint, ...]
    fast_layers: tuple[int, ...]
    slow_layers: tuple[int, ...]
    devices: tuple[str, ...] = ("cpu",)      # "cpu" or "cuda:0", "cuda:1", ...
    timeout_s: float = 300.0                 # watchdog per evaluate
    dtype: str = "bf16"                      # engine dtype: bf16 | fp16 | fp32
    env: dict = field(default_factory=dict)  # extra environment for engine processes
    # per tier, the engines' input realism (persistent_engine/inputs/tier_inputs.py); absent: the defaults
    inputs: dict = field(default_factory=dict)   # {"fast": {...}, "slow": {...}}
    start_timeout_s: float = 900.0           # an engine not ready by then fails the start (the run's budget)


@dataclass(frozen=True)
class Placement:
    tier: str
    device: str
    layers: tuple[int, ...]


def place(cfg: FleetConfig) -> list[Placement]:
    """Which engines run where (see the module docstring)."""
    gpus = [d for d in cfg.devices if d.startswith("cuda")]
    if len(gpus) >= 2:
        return [Placement("fast", d, cfg.fast_layers) for d in gpus[:-1]] + \
               [Placement("slow", gpus[-1], cfg.slow_layers)]
    dev = gpus[0] if gpus else cfg.devices[0]
    return [Placement("fast", dev, cfg.fast_layers), Placement("slow", dev, cfg.slow_layers)]


def failed_verdict(reason: str) -> Any:
    """A rejected CandidateVerdict for a failure outside the candidate's own verdict."""
    from persistent_engine import CandidateVerdict
    return CandidateVerdict(correct=False, reasons=[reason], speedup=None, per_point=[], timings={},
                            restarted=True)


ENGINE_CRASH = "crash: engine died"      # the judge process itself died (``Supervisor.evaluate``)
BUDGET_SPENT = "not evaluated: the run's budget is spent"


def unjudged(verdict: Any) -> bool:
    """A verdict about the clock, not the source: refused or cut by the run's budget (``BUDGET_SPENT``),
    or refused by the judge for want of time (``Judge.refusal``). Not counted, not remembered."""
    return any(str(r).startswith("not evaluated: ") for r in getattr(verdict, "reasons", ()) or ())


def cut_by_deadline(verdict: Any, capped_s: float) -> Any:
    """A verdict of an evaluation whose timeout the run's deadline shortened to ``capped_s``: a "hang" there
    is the budget's end, not the candidate's (on the H100 a fast-tier winner's slow confirmation got 0.2 s
    and was rejected as a hang, and remembered so for the next run)."""
    if not verdict.correct and any(str(r).startswith("hang: ") for r in verdict.reasons):
        cut = failed_verdict(f"{BUDGET_SPENT} (its evaluation was cut at the run's end, {capped_s:.1f} s in)")
        return dataclasses.replace(cut, timings=dict(verdict.timings or {}))     # it held the device that long
    return verdict


def evaluate_with_retry(supervisor: Any, source: str, timeout_s: float, queued: list[str] | tuple = ()) -> Any:
    """``supervisor.evaluate``, repeated once on the fresh engine when the judge process itself died
    (``crash: engine died``): an engine killed from outside (OOM killer, an operator) must not reject an
    innocent candidate, and no candidate can kill the judge (its code and replies stay in its executor).
    A crash of the candidate's own executor (``crash: executor died``), a hang or a protocol failure is
    the candidate's doing: not retried. ``queued``: the sources waiting for the tier behind this one (the
    engine compiles them ahead)."""
    verdict = supervisor.evaluate(source, timeout_s, queued=queued)
    if not verdict.correct and any(str(r).startswith(ENGINE_CRASH) for r in verdict.reasons):
        again = supervisor.evaluate(source, timeout_s, queued=queued)
        return dataclasses.replace(again, restarted=True)
    return verdict


def slice_weight_bytes(model: str, layers: tuple[int, ...], dtype: str) -> int:
    """Bytes of an engine's weights: the embedding and lm_head, and its layers (ModelSpec's sizes)."""
    from persistent_engine.models.spec import DTYPE_BYTES, ModelSpec

    spec = ModelSpec.from_name(model)
    return int(spec.embedding_params() * DTYPE_BYTES[dtype] + sum(spec.weight_bytes_layer(i, dtype) for i in layers))


def co_tenant_weights(cfg: FleetConfig, p: Placement) -> int:
    """Bytes of weights the other engines placed on ``p``'s GPU hold (0 on CPU or alone on its GPU): the
    engine keeps them out of its executor pool (persistent_engine/judge/memory.py)."""
    if not p.device.startswith("cuda"):
        return 0
    others = [q for q in place(cfg) if q.device == p.device and q != p]
    return sum(slice_weight_bytes(cfg.model, q.layers, cfg.dtype) for q in others)


def make_supervisor(cfg: FleetConfig, p: Placement) -> Any:
    """Start one engine for a placement (blocks until it is ready)."""
    from persistent_engine import Supervisor
    sup = Supervisor(cfg.model, list(p.layers), p.device, list(cfg.points), dtype=cfg.dtype,
                     env={**os.environ, **cfg.env}, inputs=cfg.inputs.get(p.tier), start_timeout_s=cfg.start_timeout_s,
                     log=lambda line: log.info("%s/%s %s", p.tier, p.device, line),
                     co_tenant_weights=co_tenant_weights(cfg, p))
    sup.start()
    return sup


@runtime_checkable
class Fleet(Protocol):
    """The fast-tier and slow-tier engines of a run, started once.

    Contract (every implementation):
    - ``kind`` names it ("local", "ray"); ``cfg`` is its :class:`FleetConfig`; ``deadline`` (a
      ``time.monotonic()`` value, ``math.inf`` until the loop sets the run's budget): no evaluation
      starts past it.
    - ``start()`` boots every engine of :func:`place` and returns the fleet, ready to evaluate; when an
      engine fails to boot, the ones that started are closed and the error raised. As a context
      manager: entering starts, leaving closes.
    - ``evaluate(tier, source)`` is thread-safe and never raises: it returns the tier's
      ``CandidateVerdict``; a failure outside the candidate (an engine that died and could not
      restart, a lost actor) is a rejected verdict with the reason and ``restarted=True``; past
      ``deadline`` the reason is "not evaluated: the run's budget is spent".
    - ``profile(tier)``: the baseline's per-op profile on that tier (``Supervisor.profile()``).
    - ``restarts()``: engine restarts so far; ``engine_pids()``: one pid per engine (None where none
      runs); ``describe()``: one dict per engine with at least ``tier``, ``device``, ``layers``.
    - ``close()`` ends every engine process; closing twice is harmless.
    - Optional: ``lengthen_samples(tier, factor)`` makes every later A/B of the tier time ``factor`` x the
      device's default sample pairs and returns the count (a noisy tier, ``loop._longer_samples``).
    """

    kind: str
    cfg: FleetConfig
    deadline: float

    def start(self) -> "Fleet": ...

    def __enter__(self) -> "Fleet": ...

    def __exit__(self, *exc: Any) -> None: ...

    def evaluate(self, tier: str, source: str) -> Any: ...

    def profile(self, tier: str = "fast") -> dict: ...

    def restarts(self) -> int: ...

    def engine_pids(self) -> list[int | None]: ...

    def describe(self) -> list[dict]: ...

    def close(self) -> None: ...


class TierEngine:
    """One supervised engine of a tier, with the lock of its device."""

    def __init__(self, placement: Placement, supervisor: Any, measure_lock: threading.Lock):
        self.placement = placement
        self.supervisor = supervisor
        self.measure_lock = measure_lock
        self.failures = 0
        self.closing = False                 # set by close(): an evaluation it cuts is no verdict

    @property
    def tier(self) -> str:
        return self.placement.tier

    def evaluate(self, source: str, timeout_s: float, deadline: float = math.inf,
                 queued: Callable[[], list[str]] = list) -> Any:
        """``deadline`` (monotonic, the run's budget): no evaluation starts past it, one in flight is cut
        there, and an engine cut by it is not restarted (the run is ending). ``queued()``: the sources
        waiting for this tier behind ``source``. The engine hears of them all before the device's lock is
        taken (this engine is the caller's alone: taken from the tier's free queue), so that it loads and
        compiles them while another engine of the device times, and again once the lock is held."""
        prepare = getattr(self.supervisor, "prepare", None)
        if prepare is not None and deadline > time.monotonic():
            try:
                prepare([source, *queued()])
            except Exception as e:  # noqa: BLE001 - only a head start: the evaluation below says what is wrong
                log.warning("engine %s/%s: preparing ahead failed: %s", self.tier, self.placement.device, e)
        with self.measure_lock:
            left = deadline - time.monotonic()
            if left <= 0:
                return failed_verdict(BUDGET_SPENT)
            capped = left < timeout_s
            try:
                if capped:
                    self.supervisor.auto_restart = False
                    return cut_by_deadline(evaluate_with_retry(self.supervisor, source, left, queued()), left)
                return evaluate_with_retry(self.supervisor, source, timeout_s, queued())
            except Exception as e:  # noqa: BLE001 - the run goes on without this verdict
                if self.closing:             # the run ended under an overrunning agent's evaluation
                    return failed_verdict(f"{BUDGET_SPENT} (the fleet closed)")
                self.failures += 1
                log.warning("engine %s/%s failed: %s", self.tier, self.placement.device, e)
                return failed_verdict(f"engine error: {type(e).__name__}: {e}")
            finally:
                if capped:
                    self.supervisor.auto_restart = True

    def profile(self) -> dict:
        """The baseline's per-op profile; one retry on a fresh engine if the engine died meanwhile."""
        with self.measure_lock:
            try:
                return self.supervisor.profile()
            except Exception as e:  # noqa: BLE001
                self.failures += 1
                log.warning("engine %s/%s failed profiling (%s); retrying once", self.tier, self.placement.device, e)
                return self.supervisor.profile()

    def restarts(self) -> int:
        return len(getattr(self.supervisor, "restarts", ())) + self.failures

    def pid(self) -> int | None:
        proc = getattr(self.supervisor, "proc", None)
        return None if proc is None else proc.pid

    def close(self) -> None:
        self.closing = True
        try:
            self.supervisor.close()
        except Exception as e:  # noqa: BLE001
            log.warning("closing engine %s/%s: %s", self.tier, self.placement.device, e)


class LocalFleet:
    """A :class:`Fleet` of local engine processes."""

    kind = "local"

    def __init__(self, cfg: FleetConfig):
        self.cfg = cfg
        self.engines: list[TierEngine] = []
        self.deadline = math.inf             # the run's budget: set by the loop once the fleet is up
        self._free: dict[str, queue.Queue] = {"fast": queue.Queue(), "slow": queue.Queue()}
        self._queued: dict[str, list[str]] = {"fast": [], "slow": []}   # sources waiting for a tier's engine
        self._queued_lock = threading.Lock()
        self._kernels: str | None = None     # the run's kernel cache directory, while started

    def start(self) -> "LocalFleet":
        from persistent_engine import KERNEL_CACHE_ENV

        locks: dict[str, threading.Lock] = {}
        placements = place(self.cfg)
        started: list[TierEngine | BaseException] = [None] * len(placements)  # type: ignore[list-item]
        # one kernel cache for the run's engines: the slow tier's confirmation of a source does not compile
        # its kernels again (persistent_engine/executor/kernel_cache.py; removed at close)
        scratch.remove_stale("kernels")      # those of runs that died (their lock is free)
        self._kernels = scratch.owned_dir("kernels")
        cfg = dataclasses.replace(self.cfg, env={**self.cfg.env, KERNEL_CACHE_ENV: self._kernels})

        def boot(i: int, p: Placement) -> None:
            try:
                started[i] = TierEngine(p, make_supervisor(cfg, p), locks.setdefault(p.device, threading.Lock()))
            except BaseException as e:  # noqa: BLE001 - reported below
                started[i] = e

        for p in placements:                  # locks first: boot threads must not race on setdefault
            locks.setdefault(p.device, threading.Lock())
        threads = [threading.Thread(target=boot, args=(i, p), daemon=True) for i, p in enumerate(placements)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        errors = [e for e in started if isinstance(e, BaseException)]
        self.engines = [e for e in started if isinstance(e, TierEngine)]
        if errors:
            self.close()
            raise errors[0]
        for e in self.engines:
            self._free[e.tier].put(e)
        return self

    def __enter__(self) -> "LocalFleet":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _take(self, tier: str) -> TierEngine:
        return self._free[tier].get()

    def evaluate(self, tier: str, source: str) -> Any:
        with self._queued_lock:
            self._queued[tier].append(source)
        try:
            engine = self._take(tier)
        finally:
            with self._queued_lock:
                self._queued[tier].remove(source)
        try:
            return engine.evaluate(source, self.cfg.timeout_s, self.deadline, queued=lambda: self.queued(tier))
        finally:
            self._free[tier].put(engine)

    def queued(self, tier: str) -> list[str]:
        """The sources waiting for an engine of ``tier`` now, first come first."""
        with self._queued_lock:
            return list(self._queued[tier])

    def profile(self, tier: str = "fast") -> dict:
        engine = self._take(tier)
        try:
            return engine.profile()
        finally:
            self._free[tier].put(engine)

    def lengthen_samples(self, tier: str, factor: int) -> int:
        """Every later A/B of ``tier`` times ``factor`` x the device's default sample pairs (a noisy tier,
        ``compiler.search.loop.measure_baseline``); returns the new count."""
        from persistent_engine import timing

        n = factor * timing.DEFAULT_SAMPLES.get(self.cfg.devices[0].split(":")[0], timing.DEFAULT_SAMPLES["cuda"])
        for e in self.engines:
            if e.tier == tier:
                e.supervisor.samples = n
        return n

    def restarts(self) -> int:
        return sum(e.restarts() for e in self.engines)

    def engine_pids(self) -> list[int | None]:
        return [e.pid() for e in self.engines]

    def describe(self) -> list[dict]:
        """Per engine: tier, device, layers and, where its ready line said, the layer-level logits bound
        calibrated at its start-up (``logit_bound``: min and max over points and variants) and the routing
        its MoE layers measured (``routing``: ``persistent_engine.routing.RoutingStats.to_dict``)."""
        out = []
        for e in self.engines:
            d = {"tier": e.tier, "device": e.placement.device, "layers": list(e.placement.layers)}
            info = getattr(e.supervisor, "ready_info", None) or {}
            if info.get("routing"):
                d["routing"] = info["routing"]
            tol = info.get("logit_tol")
            if tol:
                flat = [t for row in tol for t in row]
                d["logit_bound"] = [min(flat), max(flat)]
            out.append(d)
        return out

    def close(self) -> None:
        for e in self.engines:
            e.close()
        self.engines = []
        if self._kernels is not None:
            scratch.release(self._kernels)
            self._kernels = None

