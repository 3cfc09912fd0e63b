"""Agents as Ray actors (``--fleet ray``): the agent's cycle runs in the actor, the judgment stays
with the orchestrator.

Each ``AgentActor`` builds the ``i``-th agent of the ``--agents`` spec and opens its own board from
the run's URL (SQLite on one machine, PostgreSQL across machines). :class:`RayAgent` is the local
stand-in the swarm runs: its ``run_once`` starts one cycle in the actor and serves the cycle's
``evaluate`` calls, which come back to the orchestrator (fleet, acceptance, board bookkeeping) and
whose verdicts go back to the actor. The stop event and the deadline are forwarded; time is sent as
"seconds left" because clocks of different machines do not agree.

    actor thread:   agent.run_once(remote_ctx) -> remote_ctx.evaluate(src) puts a request, waits
    orchestrator:   RayAgent.run_once(ctx): poll -> ctx.evaluate(src) -> deliver(verdict) -> ... -> done
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from agents import Agent, AgentContext
from persistent_engine import WorkloadPoint


class _AgentActorImpl:
    """Body of the Ray actor: one agent and the cycle running in it."""

    def __init__(self, spec: str, index: int, device: str, board_url: str):
        from bulletin_board import Board
        from compiler.search.agent_spec import build_agents

        self.agent = build_agents(spec, device)[index]
        self.board = Board(board_url)
        self.requests: queue.Queue = queue.Queue()
        self.replies: queue.Queue = queue.Queue()
        self.stop = threading.Event()

    def name(self) -> str:
        return self.agent.name

    def kind(self) -> str:
        return self.agent.kind

    def start_cycle(self, run_id: Any, profile: dict, points: list[WorkloadPoint], spec: Any, ops: dict,
                    seconds_left: float, lease_s: float) -> None:
        self.stop.clear()

        def evaluate(source: str, *, author: str, idea_id: Any = None, parent: Any = None, **_: Any) -> Any:
            self.requests.put(("evaluate", source, author, idea_id, parent))
            while True:
                try:
                    return self.replies.get(timeout=0.5)
                except queue.Empty:
                    if self.stop.is_set():
                        raise TimeoutError("swarm stopped while the candidate waited for its verdict")

        ctx = AgentContext(board=self.board, run_id=run_id, evaluate=evaluate, profile=profile, points=points,
                           spec=spec, ops=ops, deadline=time.monotonic() + seconds_left, lease_s=lease_s,
                           stop=self.stop)

        def cycle() -> None:
            try:
                self.requests.put(("done", bool(self.agent.run_once(ctx))))
            except BaseException as e:  # noqa: BLE001 - reported to the orchestrator, which posts it
                self.requests.put(("error", f"{type(e).__name__}: {e}"))

        threading.Thread(target=cycle, name=f"agent-{self.agent.name}", daemon=True).start()

    def poll(self, wait_s: float) -> tuple | None:
        try:
            return self.requests.get(timeout=wait_s)
        except queue.Empty:
            return None

    def deliver(self, verdict: Any) -> None:
        self.replies.put(verdict)

    def halt(self) -> None:
        self.stop.set()

    def usage(self) -> Any:
        return self.agent.usage()


class RayAgent(Agent):
    """The swarm's handle on an agent living in a Ray actor."""

    def __init__(self, name: str, actor: Any, kind: str = "program"):
        super().__init__(name)
        self.actor, self.kind = actor, kind            # the remote agent's kind ("llm", ...)

    def run_once(self, ctx: AgentContext) -> bool:
        import ray

        ref = getattr(ctx.run_id, "id", ctx.run_id)
        ray.get(self.actor.start_cycle.remote(ref, dict(ctx.profile), list(ctx.points), ctx.spec, dict(ctx.ops),
                                              max(ctx.time_left(), 0.0), ctx.lease_s))
        halted = False
        while True:
            if ctx.expired() and not halted:
                self.actor.halt.remote()
                halted = True
            msg = ray.get(self.actor.poll.remote(0.5))
            if msg is None:
                continue
            if msg[0] == "evaluate":
                _, source, author, idea_id, parent = msg
                ray.get(self.actor.deliver.remote(ctx.evaluate(source, author=author, idea_id=idea_id,
                                                               parent=parent)))
            elif msg[0] == "done":
                return msg[1]
            else:
                raise RuntimeError(f"agent actor {self.name}: {msg[1]}")

    def usage(self) -> Any:
        import ray
        return ray.get(self.actor.usage.remote())


def remote_agents(spec: str, count: int, device: str, board_url: str) -> list[RayAgent]:
    """One Ray actor per agent of ``spec`` (``count`` of them), each wrapped for the swarm."""
    import ray

    actor_cls = ray.remote(num_cpus=0)(_AgentActorImpl)
    actors = [actor_cls.remote(spec, i, device, board_url) for i in range(count)]
    names = ray.get([a.name.remote() for a in actors])
    kinds = ray.get([a.kind.remote() for a in actors])
    return [RayAgent(n, a, k) for n, a, k in zip(names, actors, kinds)]
