"""compiler/search/memory.py on a real board: a run on the same deployment and shape class judges no remembered
candidate again (accepted ones are adopted with their figures), a moved workload judges anew, and a
continued run's offline agents start from the previous best setting."""

from __future__ import annotations

import dataclasses
import json

import pytest

from agents.offline import KernelSearchAgent, OfflineTeam
from agents.offline.strategy import BanditStrategy
from agents.templates import Choice, dims_of, get_template
from bulletin_board import Board
from compiler.search.acceptance import Accepted, Acceptor, Decision
from compiler.search.memory import RunMemory, shape_class
from compiler.plan.artifact import PointSpeedup
from persistent_engine.models.spec import ModelSpec
from persistent_engine.supervisor import CandidateVerdict
from persistent_engine.io_struct import WorkloadPoint

POINTS = [WorkloadPoint(phase="decode", batch=8, context=300, chunk=1), WorkloadPoint(phase="prefill", batch=1, context=0, chunk=512)]
LINEAR = get_template("linear.torch_small_m")


@pytest.fixture
def board(tmp_path):
    b = Board(f"sqlite:///{tmp_path / 'board.db'}")
    yield b
    b.close()


def _memory(board, points=POINTS, traffic="t1"):
    run = board.create_run(model="tiny-dense", hw="cpu", traffic_hash=traffic)
    shape = shape_class("cpu", "bf16", points, [0], [0, 1])
    return run, RunMemory(board, run.id, model="tiny-dense", hw="cpu", shape=shape, traffic_hash=traffic)


def _acceptor():
    return Acceptor(lambda tier, src: CandidateVerdict(correct=True, reasons=[], speedup=1.0), POINTS,
                    {"fast": 0.02, "slow": 0.02})


def _template_idea(board, run, m):
    c = Choice(LINEAR, {"TLIN_FP32_MAX_M": m})
    return board.post_idea(run, author="k", title=c.key(), target="linear",
                           body=json.dumps({"kind": "template", **c.to_dict()}))


def test_shape_class_follows_the_buckets_of_the_workload_points():
    same = [dataclasses.replace(POINTS[0], context=400), POINTS[1]]                # 300 and 400: one power-of-two bucket
    moved = [dataclasses.replace(POINTS[0], batch=32), POINTS[1]]
    key = shape_class("cpu", "bf16", POINTS, [0], [0, 1])
    assert shape_class("cpu", "bf16", same, [0], [0, 1]) == key
    assert shape_class("cpu", "bf16", moved, [0], [0, 1]) != key
    assert shape_class("cuda", "bf16", POINTS, [0], [0, 1]) != key
    assert shape_class("cpu", "bf16", POINTS, [0, 1], [0, 1]) != key


def test_a_later_run_judges_no_remembered_candidate_twice_and_adopts_accepted_ones(board):
    run1, mem1 = _memory(board)
    acc1 = _acceptor()
    rejected, kept = "OVERRIDES = {'a': 1}\n", "OVERRIDES = {'b': 2}\n"
    mem1.remember(rejected, CandidateVerdict(correct=False, reasons=["op-level: wrong"], speedup=None),
                  Decision(False, "fast", "rejected"), acc1, idea_id=_template_idea(board, run1, 2).id)
    acc1.accepted.append(Accepted(name="k-linear-1", source=kept, author="k", targets=("linear",), config_keys=(),
                                  fast=1.4, slow=1.3, per_point=(PointSpeedup(WorkloadPoint("decode", 1), 1.4, 1.3),),
                                  noise=0.02))
    mem1.remember(kept, CandidateVerdict(correct=True, reasons=[], speedup=1.4), Decision(True, "slow", "ok"), acc1)

    _, mem2 = _memory(board, traffic="t2")                              # drifted traffic, same shape class
    acc2 = _acceptor()
    v = mem2.recalled(rejected, acc2)
    assert v is not None and not v.correct and "remembered" in v.reasons[0] and "wrong" in v.reasons[1]
    v = mem2.recalled(kept, acc2)
    assert v is not None and v.correct and v.speedup == 1.4
    [adopted] = acc2.accepted
    assert (adopted.name, adopted.fast, adopted.slow, adopted.targets) == ("k-linear-1", 1.4, 1.3, ("linear",))
    assert mem2.recalled("OVERRIDES = {'new': 3}\n", acc2) is None and mem2.hits == 2

    _, mem3 = _memory(board, points=[dataclasses.replace(POINTS[0], batch=64), POINTS[1]])   # the workload moved
    assert mem3.recalled(kept, _acceptor()) is None and mem3.recalled(rejected, _acceptor()) is None


def test_a_continued_run_starts_from_the_previous_best_setting(board):
    run1, mem1 = _memory(board)
    for m, speedup in ((4, 1.3), (8, 0.9), (16, None)):
        c = Choice(LINEAR, {"TLIN_FP32_MAX_M": m})
        src = f"# {c.key()}\nOVERRIDES = {{}}\n"
        mem1.remember(src, CandidateVerdict(correct=speedup is not None, reasons=[], speedup=speedup),
                      Decision(False, "fast", "x"), _acceptor(), idea_id=_template_idea(board, run1, m).id)
    _, mem2 = _memory(board)
    team = OfflineTeam(device="cpu")
    agent = KernelSearchAgent("k0", team, strategy="bandit")
    assert mem2.seed([agent]) == 3
    assert team.search.arms[LINEAR.name].best_knobs == {"TLIN_FP32_MAX_M": 4}
    assert {f"{LINEAR.name}{{TLIN_FP32_MAX_M={m}}}" for m in (4, 8, 16)} <= team.tried
    first = BanditStrategy().propose([LINEAR], {"linear": 1.0}, team.search, team.tried,
                                     dims_of(ModelSpec.from_name("tiny-dense")), agent.rng)
    # the first candidate is a neighbour of the previous best (4): 2 (8 was tried already)
    assert first is not None and first.knobs["TLIN_FP32_MAX_M"] in (2, 1, 32) and first.key() not in team.tried
