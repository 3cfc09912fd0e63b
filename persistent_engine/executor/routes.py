"""The step's discrete-decision records (``verify.RouteCall``: MoE routing, ``verify.PickCall``: the picks of a
selecting op, ``verify.SELECTIONS``: CSA / DSA indexers, M3 blocks) on the wire between judge and executor.

The judge records the reference's decisions of each (point, variant) and sends them with a layer-level
``step`` request, so the executor can replay them (``verify.RouteReplay``, ``verify.PickReplay``); the
executor sends back the decisions the candidate's step took, and the judge's ``verify.TieCheck`` decides on
them. A list entry is None where a call's output was not (weights, ids) / picks.
"""

from __future__ import annotations


def calls_to_wire(calls: list | None, scores: bool = True) -> list | None:
    """``scores`` False: the picks' indexer scores left out (a replay reads the picks only; on DeepSeek-V4-
    Flash's 3k-token prefill they are 9 MB a CSA layer, on GLM-5's 2k-token prefill over 8k positions 64 MB a
    DSA layer)."""
    from persistent_engine.verification.picks import PickCall

    if calls is None:
        return None

    def one(c):
        if c is None:
            return None
        if isinstance(c, PickCall):
            return {"kind": "picks", "op": c.op, "ids": c.ids, "scores": c.scores if scores else None, "unit": c.unit}
        return {"logits": c.logits, "ids": c.ids, "bias": c.bias, "scoring": c.scoring,
                "n_group": c.n_group, "topk_group": c.topk_group, "order": c.order}
    return [one(c) for c in calls]


def calls_from_wire(wire: list | None, device=None) -> list | None:
    from persistent_engine.verification.picks import PickCall
    from persistent_engine.verification.verify import RouteCall

    if wire is None:
        return None

    def dev(t):
        return None if t is None else (t.to(device) if device is not None else t)

    def one(c):
        if c is None:
            return None
        if c.get("kind") == "picks":
            return PickCall(str(c["op"]), dev(c["ids"]), dev(c["scores"]), dev(c.get("unit")))
        return RouteCall(dev(c["logits"]), dev(c["ids"]), dev(c["bias"]), str(c["scoring"]), int(c["n_group"]),
                         int(c["topk_group"]), dev(c["order"]))
    return [one(c) for c in wire]
