"""The op contract: does an implementation behave like the reference on fresh random inputs?

``check_op(name, impl)`` returns a list of failures, one line each, empty when the implementation
honours the contract. Per dtype and shape, with inputs from the op's own generator:
  1. the allocator is poisoned with NaN, then ``impl`` runs first (before any reference, so it cannot
     pick up the reference's freed output);
  2. its inputs must be bitwise unchanged;
  3. it runs a second time (after poisoning again) and must give bitwise the same outputs;
  4. output count, shapes, dtypes and device must equal the reference's at the same dtype;
  5. values must be within the op's (atol, rtol) of the reference computed in higher precision
     (float32 for 16-bit inputs, float64 for float32), NaN/inf only where the reference has them;
     integer outputs must be equal (after the op's ``canonicalize``, e.g. top-k order).
Declared in-place outputs (``OpDef.writes``): the declared rows are poisoned with NaN in the inputs before
each run (a row left unwritten stays NaN), the rows of the pool outside them must be bitwise unchanged (a
wrong or an extra row written is a ``modified input``), and the declared rows after the call are checked
like outputs, after the returned ones (``written_rows``).
Tuple arguments (a step's per-layer weights and caches) are cloned, upcast and checked element by element.
Reasons start with the op, dtype and shape, then a category: ``raised``, ``modified input``,
``nondeterministic``, ``output count``, ``shape``, ``dtype``, ``device``, ``non-finite``, ``mismatch``.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

import torch

from persistent_engine.ops import registry

__all__ = ["check_op", "compare_outputs", "judge_against", "judge_outputs", "poison_allocator", "reference_outputs",
           "run_candidate", "written_rows"]

_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}
POISON_CAP_BYTES = 1 << 30


def _as_tuple(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _tensors(args: Iterable) -> list[torch.Tensor]:
    return [t for _, t in _labelled(args)]


def _labelled(args: Iterable, prefix: str = "") -> list[tuple[str, torch.Tensor]]:
    """(label, tensor) of every tensor argument, tuple elements included ("3", "8[2]", "8[2][0]")."""
    out = []
    for i, a in enumerate(args):
        label = f"{prefix}[{i}]" if prefix else str(i)
        if isinstance(a, torch.Tensor):
            out.append((label, a))
        elif isinstance(a, (tuple, list)):
            out += _labelled(a, label)
    return out


def _map(args: Sequence, fn) -> tuple:
    """``fn`` on every tensor argument (into tuples and lists, which come back as tuples)."""
    return tuple(fn(a) if isinstance(a, torch.Tensor) else _map(a, fn) if isinstance(a, (tuple, list)) else a
                 for a in args)


def _clone(args: Sequence) -> tuple:
    return _map(args, torch.Tensor.clone)


def _upcast(args: Sequence) -> tuple:
    def up(a):
        if a.is_floating_point():
            return a.to(torch.float64 if a.dtype == torch.float32 else torch.float32)
        return a.clone()
    return _map(args, up)


# ----------------------------------------------------------------------------- declared in-place outputs
def _pools(args: Sequence, w) -> list[torch.Tensor]:
    p = args[w.pool]
    return list(p) if isinstance(p, (tuple, list)) else [p]


def _rows(pool: torch.Tensor) -> torch.Tensor:
    """[NB, BS, ...] -> [NB * BS, ...] (a view: pools are contiguous)."""
    return pool.view(pool.shape[0] * pool.shape[1], *pool.shape[2:])


def written_rows(d, args: Sequence) -> tuple:
    """Copies of the rows each declared in-place output holds after a call: per ``SlotWrite`` and pool,
    [T, ...] (the rows ``args[slots]`` in slot-mapping order)."""
    return tuple(_rows(p)[args[w.slots].long()].clone() for w in d.writes for p in _pools(args, w))


def _poison_slots(d, args: Sequence) -> None:
    """NaN into the declared rows (float pools), so a row the implementation leaves unwritten shows."""
    for w in d.writes:
        for p in _pools(args, w):
            if p.is_floating_point():
                _rows(p).index_fill_(0, args[w.slots].long(), float("nan"))


def _outside_pairs(d, args: Sequence, snapshot: Sequence) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(label, rows outside the declared ones now, the same rows before) of every declared pool."""
    out = []
    for w in d.writes:
        pools, before = _pools(args, w), _pools(snapshot, w)
        for j, (p, s) in enumerate(zip(pools, before)):
            keep = torch.ones(_rows(p).shape[0], dtype=torch.bool, device=p.device)
            keep[args[w.slots].long()] = False
            label = str(w.pool) + (f"[{j}]" if isinstance(args[w.pool], (tuple, list)) else "")
            out.append((label, _rows(p)[keep], _rows(s)[keep]))
    return out


def _declared_labels(d, args: Sequence) -> set[str]:
    """``_labelled``'s labels of the declared pools (checked by ``_outside_pairs`` instead)."""
    out = set()
    for w in d.writes:
        p = args[w.pool]
        out |= {f"{w.pool}[{j}]" for j in range(len(p))} if isinstance(p, (tuple, list)) else {str(w.pool)}
    return out


def poison_allocator(device, nbytes: int) -> None:
    """Fill ``nbytes`` of fresh memory with NaN and free it, so that an output left uninitialised by a
    kernel (reading what the allocator hands back) shows up as NaN instead of stale correct values."""
    n = max(1, min(int(nbytes), POISON_CAP_BYTES) // 4)
    buf = torch.full((n,), float("nan"), dtype=torch.float32, device=device)
    del buf


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def compare_outputs(out: tuple, ref: tuple, atol: float, rtol: float) -> list[str]:
    """Value check of ``out`` against a higher-precision ``ref`` (same count and shapes). One host sync
    when everything passes (the flags of every output read at once); the counts of a failure after."""
    flags, parts = [], []
    for o, r in zip(out, ref):
        if not r.is_floating_point():
            oi = o.to(r.dtype)
            flags += [(oi == r).all(), torch.ones((), dtype=torch.bool, device=r.device)]
            parts.append((oi, r, None, None))
            continue
        of, rf = o.to(r.dtype), r
        fin = torch.isfinite(rf)
        err = (of - rf).abs().masked_fill(~fin, 0)
        allowed = atol + rtol * rf.abs().masked_fill(~fin, 0)
        flags += [(torch.isfinite(of) == fin).all(), (err <= allowed).all()]
        parts.append((of, rf, err, allowed))
    if not flags:
        return []
    values = torch.stack(flags).tolist()
    reasons = []
    for i, (o, r, err, allowed) in enumerate(parts):
        tag = f"output {i}: " if len(ref) > 1 else ""
        same_finite, within = values[2 * i], values[2 * i + 1]
        if err is None:
            if not same_finite:
                reasons.append(f"mismatch: {tag}{int((o != r).sum())} of {r.numel()} integer values differ")
        elif not same_finite:
            n = int((torch.isfinite(o) != torch.isfinite(r)).sum())
            reasons.append(f"non-finite: {tag}{n} values are NaN/inf where the reference is not (or vice versa)")
        elif not within:
            k = int((err > allowed).sum())
            reasons.append(f"mismatch: {tag}{k} of {r.numel()} values outside tolerance (max abs error "
                           f"{float(err.max()):.3g}, atol {atol:g}, rtol {rtol:g})")
    return reasons


def _equal_flags(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> list[bool]:
    """Per pair: bitwise equal (same shape, dtype and device; floats equal after NaN/inf are mapped to
    fixed values, NaN exactly where the other has NaN). ONE host sync for all pairs (a sync per pair costs
    a device round trip each; on a GPU shared with other processes, often a time slice each)."""
    flags: list = []
    for a, b in pairs:
        if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
            flags.append(False)
        elif a.is_floating_point():
            flags.append((a.nan_to_num(0.0, 1.0, -1.0) == b.nan_to_num(0.0, 1.0, -1.0)).all()
                         & (a.isnan() == b.isnan()).all())
        else:
            flags.append((a == b).all())
    on_device = [i for i, f in enumerate(flags) if isinstance(f, torch.Tensor)]
    if on_device:
        values = torch.stack([flags[i].reshape(()) for i in on_device]).tolist()
        for i, v in zip(on_device, values):
            flags[i] = bool(v)
    return [bool(f) for f in flags]


def run_candidate(d, impl: Callable, shape: dict, dtype, device, seed: int) -> tuple[tuple | None, str | None]:
    """The half of a check that runs the implementation (in an executor, DESIGN.md "How a candidate is
    judged"): inputs from the op's generator, the allocator poisoned with NaN before each of two runs,
    inputs bitwise unchanged (declared in-place pools: outside their declared rows, which are NaN before
    each run), both runs bitwise equal. Returns (the first run's outputs, then its declared rows
    (``written_rows``); None) or (None, the reason). Host syncs: two per run (errors surfaced, inputs
    compared) and one for the determinism check."""
    args = d.make_inputs(shape, dtype, device, seed)
    if d.writes:
        _poison_slots(d, args)
    snapshot = _clone(args)
    in_bytes = sum(t.numel() * t.element_size() for t in _tensors(args))
    declared = _declared_labels(d, args) if d.writes else set()
    tensor_args = [(lab, a, s) for (lab, a), (_, s) in zip(_labelled(args), _labelled(snapshot))
                   if lab not in declared]
    outs = []
    for run in range(2):
        if run and d.writes:                     # the second run starts from the same (poisoned) pools
            for (_, a), (_, s) in zip(_labelled([args[w.pool] for w in d.writes]),
                                      _labelled([snapshot[w.pool] for w in d.writes])):
                a.copy_(s)
        poison_allocator(device, 2 * in_bytes)
        try:
            outs.append(_as_tuple(impl(*args)) + (written_rows(d, args) if d.writes else ()))
            _sync(device)
        except Exception as e:  # noqa: BLE001 - any failure of a candidate is a reason, not a crash
            return None, f"raised: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        same = _equal_flags([(a, s) for _, a, s in tensor_args])
        for (lab, _, _), ok in zip(tensor_args, same):
            if not ok:
                return None, f"modified input: argument {lab} changed"
        outside = _outside_pairs(d, args, snapshot) if d.writes else []
        for (lab, now, before), ok in zip(outside, _equal_flags([(n, b) for _, n, b in outside])):
            if not ok:
                n = int((now.nan_to_num(0.0, 1.0, -1.0) != before.nan_to_num(0.0, 1.0, -1.0))
                        .reshape(now.shape[0], -1).any(-1).sum()) if now.is_floating_point() else -1
                return None, (f"modified input: argument {lab} changed outside its declared slots "
                              f"({n} other rows written)")
    first, second = outs
    if all(isinstance(o, torch.Tensor) for o in first + second) and len(first) == len(second) and \
            not all(_equal_flags(list(zip(first, second)))):
        return None, "nondeterministic: two runs on the same inputs gave different outputs"
    return first, None


def reference_outputs(d, shape: dict, dtype, device, seed: int) -> tuple[tuple, tuple]:
    """The judge's references for one check: (native precision, higher precision) outputs of the op's
    reference (then its declared rows, ``written_rows``) on the inputs its generator draws with ``seed`` (computed before or while the candidate's
    outputs are on their way: they depend on nothing the candidate sends)."""
    snapshot = d.make_inputs(shape, dtype, device, seed)
    native, hi = _clone(snapshot), _upcast(snapshot)
    ref_native = _as_tuple(d.reference(*native)) + (written_rows(d, native) if d.writes else ())
    ref_hi = _as_tuple(d.reference(*hi)) + (written_rows(d, hi) if d.writes else ())
    return ref_native, ref_hi


def judge_against(d, first: tuple, refs: tuple[tuple, tuple], dtype,
                  devices: Sequence[str] | None = None) -> list[str]:
    """``first`` (the implementation's outputs; ``devices``: where they were produced, when they crossed
    a process) against ``refs`` (``reference_outputs``): count, shapes, dtypes, device, then values."""
    ref_native, ref_hi = refs
    if len(first) != len(ref_native) or not all(isinstance(o, torch.Tensor) for o in first):
        return [f"output count: returned {len(first)} value(s), expected {len(ref_native)} tensor(s)"]
    reasons = []
    for i, (o, r) in enumerate(zip(first, ref_native)):
        tag = f" (output {i})" if len(first) > 1 else ""
        if tuple(o.shape) != tuple(r.shape):
            reasons.append(f"shape{tag}: {list(o.shape)}, expected {list(r.shape)}")
        if o.dtype != r.dtype:
            reasons.append(f"dtype{tag}: {o.dtype}, expected {r.dtype}")
        where = devices[i] if devices is not None and i < len(devices) else str(o.device)
        if torch.device(where) != r.device:
            reasons.append(f"device{tag}: {where}, expected {r.device}")
    if reasons:
        return reasons
    first = tuple(o.to(r.device) for o, r in zip(first, ref_native))
    canon = d.canonicalize or (lambda t: t)
    atol, rtol = d.tolerance(dtype)
    return compare_outputs(canon(first), canon(ref_hi), atol, rtol)


def judge_outputs(d, first: tuple, shape: dict, dtype, device, seed: int,
                  devices: Sequence[str] | None = None) -> list[str]:
    """The half of a check that decides (in the judge): the judge draws the same inputs from the op's
    generator itself, computes the references (``reference_outputs``), and compares ``first`` with them
    (``judge_against``)."""
    return judge_against(d, first, reference_outputs(d, shape, dtype, device, seed), dtype, devices)


def _check_one(d, impl: Callable, shape: dict, dtype, device, seed: int) -> list[str]:
    first, reason = run_candidate(d, impl, shape, dtype, device, seed)
    if reason is not None:
        return [reason]
    return judge_outputs(d, first, shape, dtype, device, seed)


def check_op(name: str, impl: Callable, *, device="cpu", dtypes=(torch.float32, torch.bfloat16),
             shapes: Sequence[dict] | None = None, seed: int = 0) -> list[str]:
    """Failures of ``impl`` against the contract of op ``name`` ([] when it passes); see the module doc."""
    d = registry.get(name)
    reasons = []
    for dtype in dtypes:
        for j, shape in enumerate(shapes if shapes is not None else d.examples):
            prefix = f"{name} {_DTYPE_NAMES.get(dtype, str(dtype))} {shape}: "
            reasons += [prefix + r for r in _check_one(d, impl, shape, dtype, device, seed + 1000 * j)]
    return reasons
