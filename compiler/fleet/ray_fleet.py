"""``--fleet ray``: the same fleet with every engine a Ray actor (many machines, one code path).

Each ``EngineActor`` owns one ``Supervisor`` (so its engine process runs, and is restarted, on the
actor's node). GPU actors ask Ray for one GPU each and use ``cuda`` inside (Ray narrows
``CUDA_VISIBLE_DEVICES``); placement follows :func:`compiler.fleet.local.place` over the cluster's GPU
count. CPU actors reserve no CPU (``num_cpus=0``) so that a small local cluster can hold both
tiers; CPU engines share one measure lock, as on a single machine.

The agents run as Ray actors too (:mod:`compiler.fleet.ray_agents`); the loop creates them once this
fleet has connected to the cluster.

Ray is an optional dependency (``pip install tkcc[ray]``); it is imported only here.
Connect: ``address`` (or ``RAY_ADDRESS``) names an existing cluster; otherwise a local one starts on
127.0.0.1 and is shut down again with the fleet.
"""

from __future__ import annotations

import dataclasses
import math
import os
import queue
import threading
import time
from typing import Any

from compiler.fleet.local import (BUDGET_SPENT, FleetConfig, Placement, cut_by_deadline, evaluate_with_retry,
                                  failed_verdict, make_supervisor, place)


class RayUnavailable(RuntimeError):
    user_error = True


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RayUnavailable("--fleet ray needs Ray: pip install 'tkcc[ray]'") from None
    return ray


class _EngineActorImpl:
    """Body of the Ray actor: one supervised engine."""

    def __init__(self, cfg: FleetConfig, placement: Placement):
        self.placement = placement
        self.failures = 0
        self.sup = make_supervisor(cfg, placement)

    def evaluate(self, source: str, timeout_s: float) -> Any:
        try:
            return evaluate_with_retry(self.sup, source, timeout_s)
        except Exception as e:  # noqa: BLE001 - the run goes on without this verdict
            self.failures += 1
            return failed_verdict(f"engine error: {type(e).__name__}: {e}")

    def profile(self) -> dict:
        return self.sup.profile()

    def restarts(self) -> int:
        return len(self.sup.restarts) + self.failures

    def engine_pid(self) -> int | None:
        return None if self.sup.proc is None else self.sup.proc.pid

    def node(self) -> str:
        import socket
        return socket.gethostname()

    def close(self) -> None:
        self.sup.close()


class RayFleet:
    """A :class:`compiler.fleet.local.Fleet` of engines as Ray actors."""

    kind = "ray"

    def __init__(self, cfg: FleetConfig, address: str | None = None):
        self.cfg = cfg
        self.address = address or os.environ.get("RAY_ADDRESS")
        self.deadline = math.inf             # the run's budget: set by the loop once the fleet is up
        self.actors: list[tuple[Placement, Any, threading.Lock]] = []
        self._free: dict[str, queue.Queue] = {"fast": queue.Queue(), "slow": queue.Queue()}
        self._started_ray = False

    def start(self) -> "RayFleet":
        ray = _ray()
        if not ray.is_initialized():
            if self.address:
                ray.init(address=self.address, log_to_driver=False)
            else:
                ray.init(num_cpus=max(os.cpu_count() or 1, 2), include_dashboard=False,
                         _node_ip_address="127.0.0.1", log_to_driver=False)
                self._started_ray = True
        gpus = int(ray.cluster_resources().get("GPU", 0))
        devices = tuple(f"cuda:{i}" for i in range(gpus)) or ("cpu",)
        placements = place(dataclasses.replace(self.cfg, devices=devices))
        env = {"env_vars": {k: v for k, v in os.environ.items() if k.startswith(("TRITON_", "TKCC_"))}}
        actor_cls = ray.remote(_EngineActorImpl)
        cpu_lock = threading.Lock()
        handles = []
        for p in placements:
            on_gpu = p.device.startswith("cuda")
            inner = dataclasses.replace(p, device="cuda" if on_gpu else "cpu")
            opts = {"num_gpus": 1, "num_cpus": 0} if on_gpu else {"num_cpus": 0}
            handles.append((inner, actor_cls.options(runtime_env=env, **opts).remote(self.cfg, inner),
                            threading.Lock() if on_gpu else cpu_lock))
        try:
            ray.get([h.node.remote() for _, h, _ in handles])     # waits until every engine is ready
        except Exception:
            self.actors = handles
            self.close()
            raise
        self.actors = handles
        for item in handles:
            self._free[item[0].tier].put(item)
        return self

    def __enter__(self) -> "RayFleet":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def evaluate(self, tier: str, source: str) -> Any:
        ray = _ray()
        item = self._free[tier].get()
        _, handle, lock = item
        try:
            with lock:
                left = self.deadline - time.monotonic()
                if left <= 0:
                    return failed_verdict(BUDGET_SPENT)
                verdict = ray.get(handle.evaluate.remote(source, min(self.cfg.timeout_s, left)))
                return cut_by_deadline(verdict, left) if left < self.cfg.timeout_s else verdict
        except Exception as e:  # noqa: BLE001 - a lost actor rejects this candidate; the run goes on
            return failed_verdict(f"engine actor error: {type(e).__name__}: {e}")
        finally:
            self._free[tier].put(item)

    def profile(self, tier: str = "fast") -> dict:
        ray = _ray()
        item = self._free[tier].get()
        try:
            with item[2]:
                return ray.get(item[1].profile.remote())
        finally:
            self._free[tier].put(item)

    def restarts(self) -> int:
        ray = _ray()
        total = 0
        for _, h, _ in self.actors:
            try:
                total += ray.get(h.restarts.remote(), timeout=10)
            except Exception:  # noqa: BLE001 - a dead actor counts as one restart
                total += 1
        return total

    def engine_pids(self) -> list[int | None]:
        ray = _ray()
        return ray.get([h.engine_pid.remote() for _, h, _ in self.actors])

    def describe(self) -> list[dict]:
        return [{"tier": p.tier, "device": p.device, "layers": list(p.layers), "actor": "ray"}
                for p, _, _ in self.actors]

    def close(self) -> None:
        ray = _ray()
        for _, h, _ in self.actors:
            try:
                ray.get(h.close.remote(), timeout=30)
                ray.kill(h)
            except Exception:  # noqa: BLE001 - closing best effort
                pass
        self.actors = []
        if self._started_ray and ray.is_initialized():
            ray.shutdown()
            self._started_ray = False
