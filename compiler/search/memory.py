"""Memory across runs: what was judged for a deployment is not judged again.

The board's ``tried`` table (``Board.remember`` / ``recall``) holds, per model, hardware and *shape
class*, every candidate source judged and its verdict, with what it was (template and knobs, config
knobs, op). The shape class is what a verdict depends on: the device kind, the tiers' layers, the
model's dtype and the workload points bucketed to powers of two (phase, batch, context, chunk), so a
new traffic log whose steps land in the same buckets reuses the verdicts and one that moves them
("changed where it matters") does not. A config's acceptance also depends on the whole trace (the
replay) and on the deployment's SLO (the goodput it is scored by), so a remembered config verdict counts
only for the same ``traffic_hash`` (``config_plan.replay_key``: the trace's hash, and the SLO where one is
given).

:class:`RunMemory` (one per run) does three things:
  * ``recalled(source, acceptor)``: a verdict remembered for this source, without judging it again;
    one that was accepted is adopted into the acceptor with its remembered figures (a recompile's
    seeds thus keep what they proved, unless the workload moved);
  * ``remember(...)``: each new verdict onto the board;
  * ``seed(agents)``: the offline teams start from the best known settings: every remembered template
    result goes into the search state (strategies mutate the best knobs first) and its title into
    ``team.tried``; the best remembered configs of this traffic are replayed into ``team.configs``
    (the config agent mutates the best), those of other traffic are proposed first (``team.starts``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from typing import TYPE_CHECKING, Any, Iterable

from persistent_engine import WorkloadPoint

from compiler.search.acceptance import Accepted
from compiler.plan.artifact import PointSpeedup

if TYPE_CHECKING:
    from bulletin_board import BoardAPI

__all__ = ["RunMemory", "shape_class"]

log = logging.getLogger("tkcc.memory")
CONFIG_SEEDS = 5                 # remembered configs replayed on this traffic at the start of a run


def _bucket(x: Any) -> int:
    x = int(x or 0)
    return 0 if x <= 0 else 1 << int(math.log2(x))


def shape_class(device_kind: str, dtype: str, points: Iterable[WorkloadPoint], fast_layers: Iterable[int],
                slow_layers: Iterable[int]) -> str:
    """16 hex digits naming what a verdict depends on (module doc)."""
    shapes = sorted({(p.phase, _bucket(p.batch), _bucket(p.context), _bucket(p.chunk)) for p in points})
    doc = {"device": device_kind, "dtype": dtype, "points": shapes,
           "fast": list(fast_layers), "slow": list(slow_layers)}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def _idea_doc(board: BoardAPI, idea_id: Any) -> tuple[str, str, dict]:
    """(title, target, body JSON) of the idea a candidate came from ("", "", {} when none)."""
    if idea_id is None:
        return "", "", {}
    try:
        idea = board.get_idea(idea_id)
        body = json.loads(idea.body or "{}") if idea is not None else {}
    except (ValueError, AttributeError):
        return "", "", {}
    return idea.title, idea.target or "", body if isinstance(body, dict) else {}


class RunMemory:
    def __init__(self, board: BoardAPI, run_id: Any, *, model: str, hw: str, shape: str, traffic_hash: str):
        self.board, self.run_id, self.model, self.hw = board, run_id, model, hw
        self.shape, self.traffic_hash = shape, traffic_hash
        try:
            rows = board.recall(model, hw, shape)
        except Exception as e:  # noqa: BLE001 - memory is best effort: a board without it judges anew
            log.warning("no memory of earlier runs: %s", e)
            rows = []
        self.known = {t.source_hash: t for t in rows if t.run_id != getattr(run_id, "id", run_id)}
        self.hits = 0

    def recalled(self, source: str, acceptor: Any) -> Any:
        """The remembered verdict of ``source`` (a ``CandidateVerdict``), None when it must be judged."""
        from persistent_engine import CandidateVerdict

        t = self.known.get(hashlib.sha256(source.encode()).hexdigest())
        if t is None or (t.kind == "config" and t.metrics.get("traffic_hash") != self.traffic_hash):
            return None
        if t.verdict == "accepted" and not self._adopt(t, source, acceptor):
            return None
        self.hits += 1
        return CandidateVerdict(correct=t.verdict != "rejected",
                                reasons=[f"remembered: judged in run {t.run_id} ({t.verdict})"] +
                                list(t.metrics.get("reasons", []))[:1], speedup=t.speedup,
                                timings={"remembered": True})

    def _adopt(self, t: Any, source: str, acceptor: Any) -> bool:
        """A remembered accepted candidate into ``acceptor`` (``ConfigAcceptor`` or ``Acceptor``)."""
        from compiler.search.config_plan import ConfigAccepted

        m = t.metrics.get("accepted")
        if not isinstance(m, dict):
            return False
        kw = dict(name=m["name"], source=source, author=m.get("author", "memory"), targets=tuple(m["targets"]),
                  config_keys=tuple(m.get("config_keys", ())), fast=float(m["fast"]), slow=float(m["slow"]),
                  per_point=tuple(PointSpeedup.from_dict(p) for p in m.get("per_point", ())), noise=float(m.get("noise", 0.0)),
                  description=m.get("description", ""))
        if t.kind == "config" and hasattr(acceptor, "configs"):
            acceptor.configs.append(ConfigAccepted(**kw, projected=dict(m.get("projected") or {}),
                                                   score=float(m.get("score", 1.0))))
        else:
            inner = getattr(acceptor, "inner", acceptor)
            if any(a.source == source for a in inner.accepted):
                return True
            inner.accepted.append(Accepted(**kw))
        return True

    def remember(self, source: str, verdict: Any, decision: Any, acceptor: Any, *, idea_id: Any = None) -> None:
        """The verdict of a newly judged ``source`` onto the board (best effort)."""
        from compiler.search.config_plan import config_only

        title, target, body = _idea_doc(self.board, idea_id)
        config = config_only(source)
        kind = "config" if config is not None else str(body.get("kind") or "source")
        accepted = bool(getattr(decision, "accepted", False))
        metrics: dict = {"reasons": list(getattr(verdict, "reasons", []) or [])[:3], "traffic_hash": self.traffic_hash}
        if accepted:
            pool = list(getattr(acceptor, "configs", [])) + list(getattr(acceptor, "inner", acceptor).accepted)
            a = next((x for x in reversed(pool) if x.source == source), None)
            if a is not None:
                metrics["accepted"] = {"name": a.name, "author": a.author, "targets": list(a.targets),
                                       "config_keys": list(a.config_keys), "fast": a.fast, "slow": a.slow,
                                       "per_point": [p.to_dict() for p in a.per_point], "noise": a.noise,
                                       "description": a.description, "projected": getattr(a, "projected", None),
                                       "score": getattr(a, "score", None)}
        verdict_name = "accepted" if accepted else ("correct" if getattr(verdict, "correct", False) else "rejected")
        try:
            self.board.remember(self.run_id, model=self.model, hw=self.hw, shape_class=self.shape, source=source,
                                verdict=verdict_name, speedup=getattr(verdict, "speedup", None), kind=kind,
                                target=target or ("config" if config is not None else ""), title=title,
                                knobs=body.get("knobs") or config or {}, metrics=metrics)
        except Exception as e:  # noqa: BLE001
            log.warning("remember failed: %s", e)

    def seed(self, agents: list[Any]) -> int:
        """The offline teams start from what earlier runs found (module doc); returns rows taken in."""
        from agents.offline import OfflineTeam
        from agents.offline import config_title

        teams = {id(a.team): a.team for a in agents if isinstance(getattr(a, "team", None), OfflineTeam)}
        taken = 0
        for team in teams.values():
            configs = []
            for t in self.known.values():
                if t.kind == "template":
                    taken += team.record_result({"template": t.title.split("{")[0], "knobs": t.knobs},
                                                t.verdict != "rejected", t.speedup)
            with team.lock:
                for t in self.known.values():
                    other_traffic = t.kind == "config" and t.metrics.get("traffic_hash") != self.traffic_hash
                    if other_traffic and t.knobs:      # judged on other traffic: proposed first, judged again
                        team.starts.append(dict(t.knobs))
                        continue
                    if t.title:
                        team.tried.add(t.title)
                    if t.kind == "config" and t.title.startswith("config{") and t.knobs:
                        configs.append(t)
            if team.judge is None:
                continue
            space = set(team.judge.space.knobs())
            for t in configs[:CONFIG_SEEDS]:
                knobs = dict(t.knobs)
                if set(knobs) != space:
                    continue
                score = team.judge.evaluate(knobs)["score"]        # replayed on this run's traffic
                with team.lock:
                    team.configs.append((knobs, score))
                    team.tried.add(config_title(knobs))
                taken += 1
        return taken
