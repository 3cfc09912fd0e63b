"""MoE routing records (``verify.RouteCall``) on the wire between judge and executor.

The judge records the reference routing of each (point, variant) and sends it with a layer-level
``step`` request, so the executor can replay it (``verify.RouteReplay``); the executor sends back the
routing the candidate's step chose, and the judge's ``verify.TieCheck`` decides on it. A list entry is
None where a call's output was not (weights, ids).
"""

from __future__ import annotations


def calls_to_wire(calls: list | None) -> list | None:
    if calls is None:
        return None
    return [None if c is None else {"logits": c.logits, "ids": c.ids, "bias": c.bias, "scoring": c.scoring,
                                    "n_group": c.n_group, "topk_group": c.topk_group, "order": c.order}
            for c in calls]


def calls_from_wire(wire: list | None, device=None) -> list | None:
    from persistent_engine.verify import RouteCall

    if wire is None:
        return None

    def dev(t):
        return None if t is None else (t.to(device) if device is not None else t)

    return [None if c is None else RouteCall(dev(c["logits"]), dev(c["ids"]), dev(c["bias"]), str(c["scoring"]),
                                             int(c["n_group"]), int(c["topk_group"]), dev(c["order"]))
            for c in wire]
