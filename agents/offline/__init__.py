"""Offline agents: kernel-template search and config search, no LLM needed (docs/internals.md, Agents);
and the random search they are measured against (``random_search``, ``--agents random:N``).

    from agents.offline import make_offline_agents
    agents = make_offline_agents(4, device="cpu", trace=trace, profile=profile)
    result = agents_module.run_swarm(agents, ctx, budget_s=120)
"""

from __future__ import annotations

from typing import Any, Mapping

from agents.offline.config_search import (ConfigJudge, ConfigSearchAgent, ConfigSpace, MeasuredStepTime,
                                          config_title, engine_config, samples_from_profile)
from agents.offline.kernel_search import KernelSearchAgent
from agents.offline.random_search import RandomPool, RandomSearchAgent, make_random_agents
from agents.offline.strategy import (STRATEGIES, BanditStrategy, EvolutionStrategy, SearchState, op_priors, op_shares,
                                     reward_of)
from agents.offline.worker import OfflineAgent, OfflineTeam

EAGER_FACTOR_CUDA = 3.0

__all__ = ["EAGER_FACTOR_CUDA", "config_title",
           "BanditStrategy", "ConfigJudge", "ConfigSearchAgent", "ConfigSpace", "EvolutionStrategy",
           "KernelSearchAgent", "MeasuredStepTime", "OfflineAgent", "OfflineTeam", "RandomPool", "RandomSearchAgent",
           "STRATEGIES", "SearchState", "engine_config", "make_offline_agents", "make_random_agents", "op_priors",
           "op_shares", "reward_of", "samples_from_profile"]


def make_offline_agents(n: int, *, device: str = "cpu", trace: Any = None, profile: Mapping | None = None,
                        judge: ConfigJudge | None = None, config_agents: int | None = None,
                        strategy: str | None = None, seed: int = 0, prefix: str = "offline",
                        **judge_kw) -> list[OfflineAgent]:
    """``n`` offline agents sharing one team: ``config_agents`` config searchers (default 1 when there
    is traffic with measured step times and n >= 2, else 0), the rest kernel searchers alternating
    bandit and evolution (or all ``strategy``). ``judge_kw`` go to ``ConfigJudge.from_profile``
    (``kv_capacity_tokens``, ``slo``, ``time_scale``, ``eager_factor``: pass a measured
    eager/graph step-time ratio; the default assumes 3 on CUDA and 1 on CPU)."""
    if n < 1:
        raise ValueError("make_offline_agents: n must be at least 1")
    if judge is None and trace is not None and samples_from_profile(profile):
        # a decode step outside every CUDA graph is assumed 3x slower on a GPU unless measured
        judge_kw.setdefault("eager_factor", EAGER_FACTOR_CUDA if device == "cuda" else 1.0)
        judge = ConfigJudge.from_profile(trace, profile, **judge_kw)
    n_config = config_agents if config_agents is not None else (1 if judge is not None and n >= 2 else 0)
    if n_config and judge is None:
        raise ValueError("config agents need traffic and measured step times (trace and profile, or a judge)")
    team = OfflineTeam(device=device, judge=judge)
    names = list(STRATEGIES)
    agents: list[OfflineAgent] = []
    for i in range(n - n_config):
        agents.append(KernelSearchAgent(f"{prefix}-kernel-{i}", team, strategy=strategy or names[i % len(names)],
                                        seed=seed))
    for i in range(n_config):
        agents.append(ConfigSearchAgent(f"{prefix}-config-{i}", team, seed=seed))
    return agents
