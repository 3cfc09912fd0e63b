"""The judge's checks of a candidate whose code runs in an executor (``e``: the judge ``Engine``).

``remote_check``: ``contract.check_op``'s signature with the implementation run in the executor (one request
per op and seed: it draws the inputs from the op's generator with the judge's seed and runs the override
twice, ``run_candidate``); the judge draws the same inputs meanwhile and decides (``judge_against``).
``layer_level``: the slice with the overrides run by the executor on the judge's workloads (``remote_steps``:
every point and variant in one request), its logits against the judge's reference. ``spot_check``: timed runs
(the judge's copies of its ring) against its own reference on the same (chained) token ids. ``default_points``,
``weight_share``: the workload points and their relative weights. ``spot_checks``: every timed point's
kept runs with the candidate stopped, then the shared weights' fingerprints (``weights_reason``).
"""

from __future__ import annotations

import sys

import torch

from persistent_engine.verification import guards, interpreter, verify
from persistent_engine.executor import wire
from persistent_engine.judge import memory
from persistent_engine.io_struct import WorkloadPoint
from persistent_engine.judge.types import CandidateRaised


def default_points(device: str) -> list[WorkloadPoint]:
    if device.startswith("cuda"):
        return [WorkloadPoint("decode", 1, 1024, 1, 0.4), WorkloadPoint("decode", 32, 1024, 1, 0.4),
                WorkloadPoint("prefill", 1, 0, 512, 0.2)]
    return [WorkloadPoint("decode", 1, 24, 1, 0.5), WorkloadPoint("decode", 3, 40, 1, 0.3),
            WorkloadPoint("prefill", 1, 0, 16, 0.2)]


def weight_share(points: list[WorkloadPoint], i: int) -> float:
    """Point i's weight over the heaviest point's (``timing.samples_for``: minor points get fewer samples)."""
    heaviest = max(float(p.weight) for p in points)
    return float(points[i].weight) / heaviest if heaviest > 0 else 1.0


def declared_ops_reasons(source: str, reported: list[str]) -> list[str]:
    """The source decides what is verified: the ops its ``OVERRIDES`` dict literal declares (the parse that
    acceptance and composition read, ``CandidateSource``) against those its executor reports loaded. A
    declared op not reported would go unverified; one reported and not declared was added at import. Only
    a complete literal decides (every key a string, no ``**`` spread; a composed source that spreads a
    dict built otherwise is taken as its executor reports it)."""
    import ast

    from persistent_engine.candidate import CandidateSource

    tree = ast.parse(source)
    values = [n.value for n in tree.body if isinstance(n, ast.Assign)
              and any(isinstance(t, ast.Name) and t.id == "OVERRIDES" for t in n.targets)]
    if not values or not isinstance(values[-1], ast.Dict) or not all(
            isinstance(k, ast.Constant) and isinstance(k.value, str) for k in values[-1].keys):
        return []
    declared, got = set(CandidateSource.parse(source).overrides), set(reported)
    out = [f"load: OVERRIDES declares {op!r} but the loaded module does not override it (an op hidden from "
           "verification)" for op in sorted(declared - got)]
    return out + [f"load: the loaded module overrides {op!r}, which the source's OVERRIDES literal does not "
                  "declare" for op in sorted(got - declared)]


def _nbytes(refs: tuple) -> int:
    return sum(t.numel() * t.element_size() for part in refs for t in part if isinstance(t, torch.Tensor))


def remote_check(e, deadline: float, ahead_bytes: int = memory.REFERENCES_AHEAD_BYTES):
    """``contract.check_op``'s signature, the implementation run in the executor: ONE ``op_checks``
    request carries every (dtype, shape) of the call (the executor draws each case's inputs from the op's
    generator with the judge's seed and runs the override twice, ``run_candidate``); while it runs, this
    process draws the same inputs and computes the references (``reference_outputs``: they depend on
    nothing the executor sends), then judges each case's outputs (``judge_against``). An executor whose
    mailbox would overflow answers a prefix of the cases: the rest are asked for again. ``ahead_bytes``: at
    most this much of references computed ahead (``memory.references_ahead``: within the check's budget;
    the rest as each reply is judged)."""
    from persistent_engine.ops.contract import _DTYPE_NAMES, judge_against, reference_outputs

    def check(name, impl, *, device, dtypes, shapes, seed):
        d = e.registry.get(name)
        cases = [(dtype, shape, seed + 1000 * j) for dtype in dtypes
                 for j, shape in enumerate(shapes if shapes is not None else d.examples)]
        reasons, refs, todo = [], {}, list(range(len(cases)))
        while todo:
            e._send(wire.OpChecks(name=name, cases=[
                wire.OpCase(shape=cases[k][1], dtype=str(cases[k][0]).removeprefix("torch."), seed=cases[k][2])
                for k in todo]), deadline)
            ahead = sum(_nbytes(r) for r in refs.values())
            for k in todo:                      # the judge's half, while the executor runs its half
                if ahead >= ahead_bytes:
                    break
                if k not in refs:
                    refs[k] = reference_outputs(d, cases[k][1], cases[k][0], device, cases[k][2])
                    ahead += _nbytes(refs[k])
            results = e._receive(deadline, "op_checks").results
            if not 1 <= len(results) <= len(todo):
                raise CandidateRaised(f"op_checks of {name}: the executor answered {len(results)} results "
                                      f"for {len(todo)} cases", "candidate")
            for k, r in zip(todo, results):
                dtype, shape, _ = cases[k]
                prefix = f"{name} {_DTYPE_NAMES.get(dtype, str(dtype))} {shape}: "
                ref = refs.pop(k) if k in refs else reference_outputs(d, shape, dtype, device, cases[k][2])
                if r.reason:
                    reasons.append(prefix + r.reason)
                    continue
                outs = tuple(o.to(device) if isinstance(o, torch.Tensor) else o for o in r.outputs)
                reasons += [prefix + x for x in judge_against(d, outs, ref, dtype, list(r.devices))]
            todo = todo[len(results):]
        return reasons
    return check


def remote_steps(e, msgs: list[wire.StepAsk], deadline: float) -> list[wire.StepResult]:
    """The executor's results for ``msgs``, sent as ``steps`` requests: all at once, and again for the ones
    a reply cut short (its mailbox full; a reply of no or too many results is refused)."""

    replies: list[wire.StepResult] = []
    while len(replies) < len(msgs):
        todo = msgs[len(replies):]
        results = e._call(wire.Steps(steps=todo), deadline).results
        if not 1 <= len(results) <= len(todo):
            raise CandidateRaised(f"steps: the executor answered {len(results)} results for {len(todo)} steps",
                                  "candidate")
        replies += results
    return replies


def layer_level(e, deadline: float, interpreted_nan: bool = False) -> tuple[list[str], str]:
    """The slice with the overrides, run by the executor on the judge's workloads (every point and variant
    in one request), against the judge's reference logits (calibrated bound). MoE points: the reference's
    routing sent along to be replayed; the routing the executor reports is checked against the reference's
    ties here (``verify.TieCheck``). A point's first failing variant ends its check. ``interpreted_nan``: the
    op-level check saw the interpreter's 16-bit NaN/inf and fp32 passed (``interpreter``): logits NaN/inf or
    off a finite reference are counted in the summary, not failed. Returns (reasons, summary)."""
    from persistent_engine.executor.channel import ExecutorProtocolError
    from persistent_engine.executor.launch import ExecutorBroke
    from persistent_engine.executor.routes import calls_from_wire, calls_to_wire

    counted = {n: guards.Counted(None) for n in e.candidate.ops}
    reasons: list[str] = []
    ties = verify.TieCheck(e.dtype, depths=verify.moe_depths(e.model), pick_depths=verify.pick_depths(e.model))
    todo, msgs = [], []
    # an override that declares in-place cache writes (OpDef.writes): the executor also reports any pool row
    # other than the step's new tokens' that the step changed (guards.CacheRows)
    check_cache = any(e.registry.get(n).writes for n in e.candidate.ops)
    for i in e._affected():
        for v in range(len(e.workloads[i])):
            moe = verify.decides(e.ops_at[i])          # routes experts or picks CSA entries
            refs = e.reference_routes(i, v, deadline) if moe else None
            todo.append((i, v, moe, refs))
            msgs.append(wire.StepAsk(i=i, v=v, moe=moe, refs=calls_to_wire(refs, scores=False),
                                     check_cache=check_cache))
    failed: set[int] = set()
    nan_variants = 0
    for (i, v, moe, refs), r in zip(todo, remote_steps(e, msgs, deadline)):
        if i in failed:
            continue
        where = f"layer-level {e.points[i].label()} variant {v}"
        for n, calls in r.calls.items():
            if n in counted:
                counted[n].calls += calls
        out = r.logits.to(e.device) if r.logits is not None else (r.type,)
        if r.cache:
            reasons.append(f"{where}: the step wrote KV cache rows other than its new tokens' in "
                           f"{', '.join(r.cache[:4])}")
            failed.add(i)
            continue
        tol = e.logit_tol[i][v]
        if moe and r.routes is not None:
            w = e.workloads[i][v]
            try:                                # the record is the executor's: malformed, it is its failure
                rec_calls = calls_from_wire(r.routes.calls, e.device)
                bad = ties.compare(out, e.ref[i][v], where, refs, rec_calls, w.cu_seqlens_q, key=(i, v),
                                   replayed=r.routes.replayed, tol=tol)
            except (ExecutorProtocolError, RuntimeError, IndexError, KeyError, TypeError, ValueError) as x:
                raise ExecutorBroke("layer-level verification", f"its routing record: {type(x).__name__}: {x}") \
                    from None
        else:
            bad = verify.compare_logits(out, e.ref[i][v], e.dtype, where, tol)
        if bad and interpreted_nan and interpreter.logits_values_reason(bad) and \
                bool(torch.isfinite(e.ref[i][v]).all()):
            nan_variants += 1
        elif bad:
            reasons.append(bad)
            failed.add(i)
    e.tie_kept_rows = dict(ties.kept_rows)      # for bench's spot re-check of this candidate
    if not reasons:
        reasons += [r for r in (ties.budget_reason(),) if r]
        reasons += guards.never_called(counted, e.ops_at)
    summary = ties.summary()
    if nan_variants:
        summary = interpreter.LAYER_NOTE.format(n=nan_variants) + (f"; {summary}" if summary else "")
    return reasons, summary


def _reference_on(e, i: int, v: int, ids):
    """The judge's own step of point i, variant v on token ids ``ids`` (its workload restored after)."""
    w = e.workloads[i][v]
    saved = w.token_ids.clone()
    w.token_ids.copy_(ids.to(e.device))
    ref = e.model.step(w)
    w.token_ids.copy_(saved)
    return ref


def spot_check(e, i: int, p: WorkloadPoint, kept: list) -> str | None:
    """Timed runs picked at random after they ran (``kept``: ``ab.Fetched``, rows picked after the run),
    against this process's own reference on the same token ids (MoE points: the variant's reference,
    without the sequences the tie check left out). A chained run's link is checked first: the previous
    run's row 0 against the reference on its ids, and its argmax, which set this run's ids."""
    from persistent_engine.judge.ab import chain_argmax_reason

    for f in kept:
        where = f"spot re-check {p.label()} timed sample {f.pair}"
        out = f.out.to(e.device) if isinstance(f.out, torch.Tensor) else f.out
        if f.link is not None:
            ids_prev, row0 = f.link
            ref0 = _reference_on(e, i, f.variant, ids_prev)[:1]
            row0 = row0.to(e.device).reshape(ref0.shape) if isinstance(row0, torch.Tensor) else row0
            r = (verify.compare_logits(row0, ref0, e.dtype, where + " (chain link)", e.logit_tol[i][f.variant])
                 or chain_argmax_reason(row0, ref0, where))
            if r:
                e.workload_guard.restore()
                return r
        if f.ids is not None:
            ref = _reference_on(e, i, f.variant, f.ids)[f.rows]
        else:
            ref = e.ref[i][f.variant][f.rows]
            keep = e.tie_kept_rows.get((i, f.variant))
            if keep is not None:
                keep = keep[f.rows]
                if not bool(keep.any()):
                    continue
                out, ref = out[keep], ref[keep]
        r = verify.compare_logits(out, ref, e.dtype, where, e.logit_tol[i][f.variant])
        if r:
            e.workload_guard.restore()
            return r
    e.workload_guard.restore()
    return None


def spot_checks(e, kept: list) -> list[str]:
    """Each timed point's kept runs (``(i, point, [ab.Fetched])``: the judge's copies) against its own
    reference, the candidate's tree stopped from before the first reference step to after the weights'
    fingerprints (``weights_reason``)."""
    reasons = []
    e.candidate.executor.stop()
    try:
        for i, p, runs in kept:
            if (r := spot_check(e, i, p, runs)) is not None:
                reasons.append(r)
        if (r := weights_reason(e, "spot re-check")) is not None:
            reasons.append(r)
    finally:
        e.candidate.executor.cont()
    return reasons


def weights_reason(e, phase: str) -> str | None:
    """CUDA: the shared weights' fingerprints right after the judge's reference ran on them (an executor maps
    them writable: a change made for the check and undone before unload is caught here). CPU: the sealed
    arena, nothing to check."""
    if e.device.type != "cuda":
        return None
    e._sync()
    bad = e.weight_guard.changed()
    return f"{phase}: the shared weights changed while it was judged: {', '.join(bad[:5])}" if bad else None


def uncompiled_reasons(points, uncompiled: dict, compiled: list[int]) -> list[str]:
    """A point the baseline runs compiled but the candidate's executor could not compile (its ``Captured.
    uncompiled``) would time an eager step against a compiled one: no comparison, said with inductor's words and
    logged for the operator (a compile-cache fault shows here: on the H100 such seeded executors timed exact
    copies of the reference at 0.71-0.74x, 2026-12-06)."""
    bad = {int(k): v for k, v in uncompiled.items() if k.isdigit() and int(k) in compiled}
    for i, why in sorted(bad.items()):
        print(f"[judge] candidate's step not compiled at {points[i].label()}: {why}", file=sys.stderr, flush=True)
    return [f"timing: the candidate's step did not compile at {points[i].label()} ({why}) where the baseline's "
            "did: an eager step is no match for a compiled one" for i, why in sorted(bad.items())]
