"""``--agents`` parsing: a comma-separated list of ``kind[:count]``.

    offline:4              the offline search agents of ``agents.offline`` (kernel-template search,
                           config search), round-robin over the kinds, 4 in all
    offline:auto           the default: ``auto_offline(device)`` of them (more where a GPU judge compiles
                           queued candidates ahead and the host has the cores to feed it)
    anthropic:2 / openai:1 LLM agents (keys from ANTHROPIC_API_KEY / OPENAI_API_KEY; endpoints from
                           ANTHROPIC_BASE_URL / OPENAI_BASE_URL, models from TKCC_ANTHROPIC_MODEL /
                           TKCC_OPENAI_MODEL); all of them draw on one run budget (``llm_budget``)
    files:DIR              one agent that submits every ``*.py`` candidate in DIR (hand-written
                           kernels, or a previous plan's ``kernels/``)
    random:4               the control search (``agents.offline.random_search``): 4 agents drawing
                           template settings uniformly at random, no profile, no board, no feedback

``TKCC_SEARCH_SEED`` (an integer, default 0) seeds the offline and random agents' draws
(``benchmarks/search_vs_random.py`` runs each seed of both arms).

``FilesAgent`` is also how the loop replays a list of known candidate sources.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

from agents import Agent, AgentContext

_LLM = {"anthropic": "AnthropicAgent", "openai": "OpenAIAgent"}


class AgentSpecError(ValueError):
    user_error = True


class FilesAgent(Agent):
    """Submits a fixed list of candidate sources, one per cycle; done when the list is."""

    kind = "files"

    def __init__(self, name: str, sources: list[tuple[str, str]]):
        super().__init__(name)
        self._todo = list(sources)

    @classmethod
    def from_dir(cls, name: str, directory: str | Path) -> "FilesAgent":
        d = Path(directory)
        if not d.is_dir():
            raise AgentSpecError(f"--agents files:{directory}: not a directory")
        files = sorted(p for p in d.glob("*.py") if p.name != "composed.py")
        if not files:
            raise AgentSpecError(f"--agents files:{directory}: no *.py candidates in it")
        return cls(name, [(p.stem, p.read_text()) for p in files])

    def run_once(self, ctx: AgentContext) -> bool:
        if not self._todo or ctx.expired():
            return False
        title, source = self._todo.pop(0)
        idea = ctx.board.post_idea(ctx.run_id, author=self.name, title=f"submit {title}",
                                   body="a known candidate file", target=None)
        verdict = ctx.evaluate(source, author=self.name, idea_id=getattr(idea, "id", idea))
        ctx.post(self.name, f"{title}: correct={getattr(verdict, 'correct', False)} "
                            f"speedup={getattr(verdict, 'speedup', None)}", idea=idea)
        return bool(self._todo)


# offline agents by default: on CPU 4 (two cores, one engine judging at a time); on CUDA enough that the
# judge's executors compiling ahead (``persistent_engine.judge.executors.AHEAD``: 4) always have queued
# candidates beside the one judged and a slow-tier confirmation, where the host has a core for each
AUTO_OFFLINE = {"cpu": 4, "cuda": 8}


def auto_offline(device: str, cores: int | None = None) -> int:
    """How many offline agents ``offline:auto`` starts for ``device`` on a host of ``cores`` (None: this one)."""
    cores = cores if cores is not None else (os.cpu_count() or 1)
    wanted = AUTO_OFFLINE.get(device, AUTO_OFFLINE["cpu"])
    return max(AUTO_OFFLINE["cpu"], min(wanted, cores // 2))


def search_seed() -> int:
    """``TKCC_SEARCH_SEED`` (default 0); not an integer is an AgentSpecError."""
    raw = os.environ.get("TKCC_SEARCH_SEED", "").strip()
    try:
        return int(raw) if raw else 0
    except ValueError:
        raise AgentSpecError(f"TKCC_SEARCH_SEED must be an integer, got {raw!r}") from None


def random_agents(n: int, device: str) -> list[Agent]:
    """``n`` control-search agents (``agents.offline.random_search``) sharing one seeded draw."""
    from agents.offline import make_random_agents
    return list(make_random_agents(n, device=device, seed=search_seed()))


def offline_agents(n: int, device: str) -> list[Agent]:
    """``n`` offline agents for ``device`` ("cpu" or "cuda"): ``agents.offline.make_offline_agents``
    when the package provides it (kernel-template and config search mixed), else the kernel-template
    search agents alone."""
    try:
        offline = importlib.import_module("agents.offline")
        factory = getattr(offline, "make_offline_agents", None)
        if factory is None:
            factory = importlib.import_module("agents.offline.kernel_search").make_kernel_agents
    except (ModuleNotFoundError, AttributeError) as e:
        raise AgentSpecError(f"--agents offline: the offline agents are not installed ({e})") from None
    return list(factory(n, device=device, seed=search_seed()))


def llm_agents(kind: str, count: int, llm_budget: Any) -> list[Agent]:
    """``count`` LLM agents of ``kind`` sharing ``llm_budget`` (an ``agents.llm.SharedSpend``). A missing
    key is an AgentSpecError naming the variable (one line, exit 2)."""
    llm = importlib.import_module("agents.llm")
    cls = getattr(llm, _LLM[kind])
    try:
        return [cls(f"{kind}-{i}", shared=llm_budget) for i in range(count)]
    except llm.MissingKeyError as e:
        raise AgentSpecError(f"--agents {kind}:{count}: {e}") from None


def writes_llm_code(spec: str | None) -> bool:
    """Whether an ``--agents`` string starts LLM agents (their candidates need a complete sandbox)."""
    return any(item.strip().partition(":")[0] in _LLM for item in (spec or "").split(","))


def build_agents(spec: str, device: str = "cpu", llm_budget: Any = None) -> list[Agent]:
    """Agent instances for an ``--agents`` string (see the module docstring); names are unique.
    ``device`` ("cpu" or "cuda") tells the offline agents which kernels are worth timing;
    ``llm_budget`` (``agents.llm.SharedSpend`` or None: unlimited) is the LLM agents' run budget."""
    agents: list[Agent] = []
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        kind, _, arg = item.partition(":")
        if kind == "files":
            agents.append(FilesAgent.from_dir(f"files-{len(agents)}", arg))
            continue
        try:
            count = auto_offline(device) if (kind, arg) == ("offline", "auto") else int(arg) if arg else 1
        except ValueError:
            raise AgentSpecError(f"--agents {item!r}: the count must be an integer") from None
        if count < 1:
            raise AgentSpecError(f"--agents {item!r}: the count must be at least 1")
        if kind == "offline":
            agents += offline_agents(count, device)
        elif kind == "random":
            agents += random_agents(count, device)
        elif kind in _LLM:
            agents += llm_agents(kind, count, llm_budget)
        else:
            raise AgentSpecError(f"--agents: unknown agent kind {kind!r} (offline, random, anthropic, openai, files:DIR)")
    if not agents:
        raise AgentSpecError("--agents: no agents given")
    return agents

