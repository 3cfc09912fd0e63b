"""agents/offline/random_search.py, the control search of ``benchmarks/search_vs_random.py``: every choice it
submits is a valid, untried template setting at the model's sizes, rendered as a loadable candidate; the
sequence is fixed by the seed, and the profile (or anything else but the seed, the ops and the sizes) does not
change it; ``--agents random:2`` builds it."""

from __future__ import annotations

import time

import pytest

from agents import AgentContext, op_catalog
from agents.offline import RandomPool, RandomSearchAgent, make_random_agents
from agents.templates import dims_of, get_template, load_candidate, templates_for
from bulletin_board import Board
from compiler.search.agent_spec import AgentSpecError, build_agents
from persistent_engine.io_struct import WorkloadPoint
from persistent_engine.models.spec import ModelSpec

POINT = WorkloadPoint(phase="decode", batch=4, context=256, chunk=1, weight=1.0)
PROFILE_A = {"per_point": [{"point": POINT.to_dict(), "ops": {"linear": {"ms": 9.0}, "rms_norm": {"ms": 0.1}}}]}
PROFILE_B = {"per_point": [{"point": POINT.to_dict(), "ops": {"silu_and_mul": {"ms": 9.0}, "linear": {"ms": 0.1}}}]}


class _Verdict:
    correct, speedup, reasons, per_point = True, 1.0, [], []


@pytest.fixture
def board(tmp_path):
    b = Board(f"sqlite:///{tmp_path / 'board.db'}")
    yield b
    b.close()


def _run(board: Board, seed: int, profile: dict, cycles: int, agents: int = 1) -> list[str]:
    """The candidate sources ``agents`` random agents submit in ``cycles`` rounds, in order."""
    run = board.create_run(model="tiny-dense", hw="cpu", traffic_hash=f"t{seed}{id(profile)}{time.time()}")
    sources: list[str] = []

    def evaluate(source, **kw):
        assert kw["author"].startswith("random-") and kw["idea_id"] is not None
        sources.append(source)
        return _Verdict()

    ctx = AgentContext(board=board, run_id=run.id, evaluate=evaluate, profile=profile, points=[POINT],
                       spec=ModelSpec.from_name("tiny-dense"), ops=op_catalog(), hw="cpu",
                       deadline=time.monotonic() + 600, lease_s=30)
    team = make_random_agents(agents, device="cpu", seed=seed)
    for _ in range(cycles):
        for agent in team:
            agent.run_once(ctx)
    return sources


def test_every_choice_is_valid_untried_and_loads_until_the_library_is_spent():
    spec = ModelSpec.from_name("tiny-dense")
    dims, pool = dims_of(spec), RandomPool("cpu", seed=3)
    templates = pool.templates(op_catalog())
    valid = {f"{t.name}{{{','.join(f'{k}={v}' for k, v in sorted(kn.items()))}}}"
             for t in templates for kn in _grid(t) if not t.check(kn, dims)}
    drawn = []
    while (choice := pool.draw(templates, dims)) is not None:
        assert not choice.template.check(choice.knobs, dims) and choice.template.available_on("cpu")
        drawn.append(choice.key())
    assert len(drawn) == len(set(drawn)) == len(valid) > 5 and set(drawn) == valid
    assert pool.spent == {t.name for t in templates}


def _grid(template):
    import itertools
    names = [k.name for k in template.knobs]
    return [dict(zip(names, vs)) for vs in itertools.product(*(k.values for k in template.knobs))]


def test_a_large_grid_is_drawn_by_rejection_and_still_valid():
    spec = ModelSpec.from_name("tiny-dense")
    big = [t for t in templates_for(device="cuda") if t.space_size() > 100_000][:2]
    pool = RandomPool("cuda", seed=0)
    keys = [pool.draw(big, dims_of(spec)) for _ in range(20)]
    assert all(c is not None and not c.template.check(c.knobs, dims_of(spec)) for c in keys)
    assert len({c.key() for c in keys}) == 20 and {c.template.name for c in keys} == {t.name for t in big}


def test_the_sequence_is_fixed_by_the_seed_and_blind_to_the_profile(board):
    a = _run(board, seed=7, profile=PROFILE_A, cycles=6)
    assert len(a) == 6 and all(load_candidate(s)["OVERRIDES"] for s in a)
    assert _run(board, seed=7, profile=PROFILE_B, cycles=6) == a          # another profile: the same draws
    assert _run(board, seed=7, profile={}, cycles=3, agents=2) == a       # two agents share one draw
    assert _run(board, seed=8, profile=PROFILE_A, cycles=6) != a


def test_it_stops_when_expired_or_spent(board):
    run = board.create_run(model="tiny-dense", hw="cpu", traffic_hash="x")
    calls = []
    ctx = AgentContext(board=board, run_id=run.id, evaluate=lambda s, **kw: calls.append(s) or _Verdict(),
                       profile={}, points=[POINT], spec=ModelSpec.from_name("tiny-dense"),
                       ops={"silu_and_mul": op_catalog()["silu_and_mul"]}, hw="cpu",
                       deadline=time.monotonic() - 1, lease_s=30)
    agent = RandomSearchAgent("random-0", RandomPool("cpu", seed=0))
    assert agent.run_once(ctx) is False and calls == []
    ctx = ctx.replace(deadline=time.monotonic() + 600)
    while agent.run_once(ctx):
        pass
    dims = dims_of(ModelSpec.from_name("tiny-dense"))
    valid = sum(not t.check(kn, dims) for t in templates_for("silu_and_mul", "cpu") for kn in _grid(t))
    assert len(calls) == valid >= get_template("silu_and_mul.torch_direct").space_size() - 1 > 0
    assert all(load_candidate(s)["OVERRIDES"] for s in calls) and agent.run_once(ctx) is False


def test_agents_random_2_builds_two_seeded_agents(monkeypatch):
    monkeypatch.setenv("TKCC_SEARCH_SEED", "5")
    agents = build_agents("random:2", "cpu")
    assert [a.name for a in agents] == ["random-0", "random-1"] and agents[0].pool is agents[1].pool
    assert agents[0].pool.seed == 5 and all(isinstance(a, RandomSearchAgent) for a in agents)
    monkeypatch.setenv("TKCC_SEARCH_SEED", "five")
    with pytest.raises(AgentSpecError, match="TKCC_SEARCH_SEED"):
        build_agents("random:2", "cpu")
    monkeypatch.delenv("TKCC_SEARCH_SEED")
    with pytest.raises(AgentSpecError):
        build_agents("random:0", "cpu")
