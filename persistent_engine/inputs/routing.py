"""Realistic MoE routing for a slice: routers rebuilt so that the slice's own hidden states route with a
chosen per-layer expert load and with clear top-k margins, as a trained router does.

Random-weight routers route near-uniformly and with near-ties everywhere: their logits are a linear map of
near-Gaussian hidden states, i.e. E Gaussian draws per token, whose k-th and (k+1)-th values are ~0.08 of
the row's RMS apart for 8 of 64 experts. Real routers are skewed (a few hot experts per layer) and decided
(the chosen experts stand clear of the rest). ``plant_routing`` makes a slice route that way:

1. the target load of each MoE layer and workload (``RoutingSpec``):
   * ``power_law`` alpha: per-expert token counts from the bounded power law NVIDIA's AIConfigurator uses
     for its ``power_law_<alpha>`` MoE measurements (density ~ x^-alpha on [1, 0.8 T], or [0.01, 2] when
     T k <= E; normalised to T k tokens; no expert above T), taken at its E quantiles instead of E random
     draws so a run is reproducible; a random permutation per layer picks which experts are hot;
   * ``histogram``: measured per-expert loads (routing logs), one list for all layers or one per layer;
   * ``uniform``: the routers are left as they are (random weights: balanced, tie-prone);
2. tokens get k distinct experts with exactly those counts (AIConfigurator's layout: assignments sorted
   by expert, dealt to tokens column by column; tokens shuffled); with group-limited routing a greedy
   deal within each token's ``topk_group`` fullest groups (``assign_grouped``);
3. target router logits per token: the chosen experts at 2.0-2.5, the others N(-0.5, 0.5^2) clipped to
   [-2, 0.5] (a margin >= 1.5 logits, 1.2-1.5 x the row's RMS for top-2 of 8 to top-8 of 128; verification's
   near-tie band is 2^-5 x RMS per MoE layer of depth);
4. the router weight becomes W + dW, dW the ridge least-squares change that maps the recorded hidden states
   h [N, H] of that layer onto those logits (min-norm: dW^T = h^T (h h^T + lam I)^-1 (L - h W^T)), layer
   by layer (a layer's routing changes the next layer's hidden states). A linear router fits N <= H
   tokens exactly; ``FIT_SHARE`` x H tokens at most are fitted (beyond that the solve grows ill-conditioned
   and bf16 rounding of dW eats the margins): whole workloads from the smallest (decode batches) up, then
   the rest strided evenly over the larger ones (``fit_rows``); the others route by the rebuilt router as
   it falls (``RoutingStats.fitted_share`` says how many were fitted).

Cost: one partial step per workload per MoE layer (up to that layer's router) and one [N, N] solve per
layer, at engine start-up. Only ``router_w`` changes; the model's math (and every op) is the same.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch

__all__ = ["RoutingError", "RoutingSpec", "RoutingStats", "power_law_counts", "histogram_counts", "layer_counts",
           "assign_experts", "assign_grouped", "fit_rows", "target_logits", "plant_routing", "routing_stats"]

FIT_SHARE = 0.5             # tokens fitted per layer: at most this x hidden_size
CHOSEN_LOGIT = (2.0, 2.5)   # target logits of the chosen experts (uniform in this range)
OTHER_LOGIT = (-0.5, 0.5, -2.0, 0.5)   # the others: N(mean, std) clipped to [lo, hi]


class RoutingError(ValueError):
    """A bad routing option (exponent, histogram); one line, exit 2."""

    user_error = True


@dataclass(frozen=True)
class RoutingSpec:
    """Which expert load the slice's routers produce (see the module doc)."""

    kind: str = "uniform"                           # "uniform" | "power_law" | "histogram"
    alpha: float = 1.2                              # power_law exponent
    histogram: tuple[tuple[float, ...], ...] = ()   # per layer (cycled), per expert loads
    source: str = ""                                # where a histogram came from

    def __post_init__(self):
        if self.kind not in ("uniform", "power_law", "histogram"):
            raise RoutingError(f"unknown routing kind {self.kind!r}; use uniform, power_law or histogram")
        if self.kind == "power_law" and not (math.isfinite(self.alpha) and 0 < self.alpha <= 10):
            raise RoutingError(f"routing skew must be a finite exponent in (0, 10], got {self.alpha}")
        if self.kind == "histogram":
            if not self.histogram or not all(self.histogram):
                raise RoutingError("routing histogram is empty")
            for row in self.histogram:
                if not all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in row) or sum(row) <= 0:
                    raise RoutingError("routing histogram: every load must be a finite number >= 0, with a "
                                       "positive sum per layer")

    @classmethod
    def from_dict(cls, d: dict | None) -> "RoutingSpec":
        if not d:
            return cls()
        return cls(kind=str(d.get("kind", "uniform")), alpha=float(d.get("alpha", 1.2)),
                   histogram=tuple(tuple(float(v) for v in row) for row in d.get("histogram", ())),
                   source=str(d.get("source", "")))

    def to_dict(self) -> dict:
        d: dict = {"kind": self.kind}
        if self.kind == "power_law":
            d["alpha"] = self.alpha
        if self.kind == "histogram":
            d["histogram"] = [list(r) for r in self.histogram]
            d["source"] = self.source
        return d

    def label(self) -> str:
        return {"uniform": "uniform (random routers)", "power_law": f"power law {self.alpha:g}",
                "histogram": f"measured histogram{f' ({self.source})' if self.source else ''}"}[self.kind]

    def check_experts(self, num_experts: int) -> None:
        bad = [len(r) for r in self.histogram if len(r) != num_experts]
        if bad:
            raise RoutingError(f"routing histogram has {bad[0]} experts per layer, the model has {num_experts}")


# ----------------------------------------------------------------------------- target loads
def _fix_total(counts: torch.Tensor, total: int, cap: int) -> torch.Tensor:
    """Integer counts summing to ``total``, none above ``cap`` (excess moved to the largest with room)."""
    counts = counts.clamp(0, cap)
    order = torch.argsort(counts, descending=True, stable=True)
    i = 0
    while int(counts.sum()) != total:
        delta = total - int(counts.sum())
        e = order[i % counts.numel()]
        if delta > 0 and counts[e] < cap:
            counts[e] += 1
        elif delta < 0 and counts[e] > 0:
            counts[e] -= 1
        i += 1
    return counts


def power_law_counts(tokens: int, experts: int, k: int, alpha: float) -> torch.Tensor:
    """[E] int64 per-expert token counts, descending: the bounded power law's E quantiles (module doc)."""
    lo, hi = (1.0, tokens * 0.8) if tokens * k > experts else (0.01, 2.0)
    hi = max(hi, lo * 1.0001)
    u = 1.0 - (torch.arange(experts, dtype=torch.float64) + 0.5) / experts          # descending quantiles
    a = 1.0 - alpha
    if abs(a) < 1e-9:                                                               # density ~ 1/x
        x = lo * (hi / lo) ** u
    else:
        x = ((hi ** a - lo ** a) * u + lo ** a) ** (1.0 / a)                       # inverse CDF
    counts = torch.round(x / x.sum() * tokens * k).long()
    return _fix_total(counts, tokens * k, tokens)


def histogram_counts(loads, tokens: int, k: int) -> torch.Tensor:
    """[E] int64 counts proportional to measured ``loads``, summing to T k, none above T."""
    p = torch.tensor(list(loads), dtype=torch.float64)
    return _fix_total(torch.round(p / p.sum() * tokens * k).long(), tokens * k, tokens)


def assign_experts(counts: torch.Tensor, tokens: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """[T, k] int64: each token k distinct experts, expert e chosen by exactly counts[e] tokens. The sorted
    assignment list dealt column-wise (slot j of token t is entry j T + t): a run of <= T equal entries
    meets each token at most once."""
    flat = torch.repeat_interleave(torch.arange(counts.numel()), counts)            # [T k], grouped by expert
    ids = flat.view(k, tokens).t()
    return ids[torch.randperm(tokens, generator=gen)].contiguous()


def assign_grouped(counts: torch.Tensor, tokens: int, k: int, n_group: int, topk_group: int,
                   gen: torch.Generator) -> torch.Tensor:
    """[T, k] for group-limited routing (DeepSeek-V3: experts in ``n_group`` groups, a token's experts
    from at most ``topk_group`` of them): tokens in random order each take the ``topk_group`` groups with
    the most assignments left, then the k experts with the most left inside them (ties random). Greedy,
    so the counts are met approximately (exactly when the limit does not bind). Cost: O(T E)."""
    left = counts.double().clone()
    e = counts.numel()
    ids = torch.empty(tokens, k, dtype=torch.long)
    jitter = torch.rand(tokens, e, generator=gen, dtype=torch.float64) * 1e-3
    for t in torch.randperm(tokens, generator=gen).tolist():
        score = left + jitter[t]
        groups = score.view(n_group, -1).clamp_min(0).sum(-1).topk(topk_group).indices
        allowed = torch.zeros(n_group, dtype=torch.bool).scatter_(0, groups, True).repeat_interleave(e // n_group)
        ids[t] = score.masked_fill(~allowed, float("-inf")).topk(k).indices
        left[ids[t]] -= 1
    return ids


def target_logits(ids: torch.Tensor, experts: int, gen: torch.Generator) -> torch.Tensor:
    """[T, E] fp64 router logits whose top-k is ``ids`` with a clear margin (module doc, step 3)."""
    t, k = ids.shape
    mean, std, lo, hi = OTHER_LOGIT
    logits = (torch.randn(t, experts, generator=gen, dtype=torch.float64) * std + mean).clamp(lo, hi)
    a, b = CHOSEN_LOGIT
    chosen = a + (b - a) * torch.rand(t, k, generator=gen, dtype=torch.float64)
    return logits.scatter_(1, ids, chosen)


def layer_counts(spec: RoutingSpec, layer_pos: int, tokens: int, experts: int, k: int,
                 perm: torch.Tensor) -> torch.Tensor:
    """[E] target counts of one workload of ``tokens`` tokens at the ``layer_pos``-th MoE layer; ``perm``
    [E]: the layer's hot experts (expert perm[r] gets the r-th largest power-law count; the same for
    every workload of the layer)."""
    if spec.kind == "histogram":
        return histogram_counts(spec.histogram[layer_pos % len(spec.histogram)], tokens, k)
    return torch.zeros(experts, dtype=torch.long).scatter_(0, perm, power_law_counts(tokens, experts, k, spec.alpha))


# ----------------------------------------------------------------------------- planting
class _Stop(Exception):
    pass


def _router_inputs(model, workloads: list, block) -> list[torch.Tensor]:
    """The hidden states [T_w, H] reaching ``block``'s router in each workload (steps stop there)."""
    seen: list[torch.Tensor] = []

    def capture(h):
        seen.append(h.detach().clone())
        raise _Stop

    block.mlp.route = capture
    try:
        for w in workloads:
            try:
                model.hidden(w)
            except _Stop:
                pass
    finally:
        del block.mlp.route            # the class's method again
    return seen


def _fit(w: torch.Tensor, h: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """W + dW (in W's dtype) with h (W + dW)^T ~= target, dW of minimum norm (ridge, float64)."""
    hd, wd = h.double(), w.double()
    gram = hd @ hd.t()
    lam = 1e-4 * float(gram.diagonal().mean())
    rhs = target.to(hd) - hd @ wd.t()                                                 # [N, E]
    sol = torch.linalg.solve(gram + lam * torch.eye(gram.shape[0], dtype=hd.dtype, device=hd.device), rhs)
    return (wd + (hd.t() @ sol).t()).to(w.dtype)


def fit_rows(sizes: list[int], cap: int) -> torch.Tensor:
    """Rows (into the workloads' tokens, concatenated) to fit, at most ``cap``: whole workloads from the
    smallest up (decode batches: the heavy points of a trace, every token routed as asked), then the
    capacity left strided evenly over the rest (a long prefill chunk)."""
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    rows, rest = [], []
    for i in sorted(range(len(sizes)), key=lambda i: sizes[i]):
        span = list(range(starts[i], starts[i] + sizes[i]))
        (rows if len(rows) + sizes[i] <= cap and not rest else rest).extend(span)
    left = cap - len(rows)
    if rest and left > 0:
        pick = torch.linspace(0, len(rest) - 1, min(left, len(rest))).round().long().unique()
        rows += [rest[j] for j in pick.tolist()]
    return torch.tensor(sorted(rows), dtype=torch.long)


def plant_routing(model, workloads: list, spec: RoutingSpec, seed: int = 0) -> "RoutingStats":
    """Rebuild every MoE router of ``model`` so that ``workloads`` route as ``spec`` asks (module doc);
    returns the routing measured afterwards. ``uniform`` changes nothing."""
    mspec = model.spec
    moe_blocks = [b for b in model.blocks if hasattr(b.mlp, "router_w")]
    if spec.kind != "uniform" and moe_blocks:
        e, k = mspec.num_experts, mspec.num_experts_per_tok
        spec.check_experts(e)
        gen = torch.Generator().manual_seed(int(seed) * 7_919 + 29)
        cap = max(1, int(FIT_SHARE * mspec.hidden_size))
        for pos, block in enumerate(moe_blocks):
            hs = _router_inputs(model, workloads, block)
            perm = torch.randperm(e, generator=gen)
            ids = []
            for h in hs:
                t = h.shape[0]
                counts = layer_counts(spec, pos, t, e, k, perm)
                ids.append(assign_experts(counts, t, k, gen) if mspec.n_group <= 1 else
                           assign_grouped(counts, t, k, mspec.n_group, mspec.topk_group, gen))
            target = torch.cat([target_logits(a, e, gen) for a in ids])
            h_all = torch.cat(hs)
            rows = fit_rows([h.shape[0] for h in hs], cap)
            w = block.mlp.router_w
            w.copy_(_fit(w, h_all[rows.to(h_all.device)], target[rows].to(h_all.device)))
        fitted = len(rows) / max(1, h_all.shape[0])
    else:
        fitted = 0.0
    return dataclasses.replace(routing_stats(model, workloads), spec=spec.to_dict(), fitted_share=round(fitted, 4))


# ----------------------------------------------------------------------------- measuring
@dataclass(frozen=True)
class RoutingStats:
    """The routing a slice's workloads produce, per MoE layer (in slice order)."""

    counts: tuple[tuple[int, ...], ...] = ()   # per layer: tokens per expert, summed over workloads
    margins: tuple[float, ...] = ()            # per layer: median top-k margin / row RMS (logit units)
    near_tie: tuple[float, ...] = ()           # per layer: share of tokens within verify's tie band
    spec: dict = field(default_factory=dict)
    fitted_share: float = 0.0

    def top_share(self, n: int = 1) -> list[float]:
        """Per layer: share of all assignments taken by the ``n`` most loaded experts."""
        return [sum(sorted(c, reverse=True)[:n]) / max(1, sum(c)) for c in self.counts]

    def to_dict(self) -> dict:
        return {"spec": self.spec, "fitted_share": self.fitted_share, "counts": [list(c) for c in self.counts],
                "margin_median": list(self.margins), "near_tie_share": list(self.near_tie),
                "top1_share": [round(x, 4) for x in self.top_share(1)]}


def _margins(logits: torch.Tensor, bias: torch.Tensor | None, k: int, scoring: str) -> torch.Tensor:
    """[T] gap between the k-th and (k+1)-th expert by the choice criterion, in router-logit units / the
    row's RMS (verify.route_flips' measure for the nearest swap; groups ignored)."""
    lg = logits.double()
    if scoring == "softmax" and bias is None:
        top = lg.topk(k + 1, dim=-1).values
        gap = top[:, k - 1] - top[:, k]
    else:
        s = torch.softmax(lg, -1) if scoring == "softmax" else torch.sigmoid(lg)
        crit = s if bias is None else s + bias.double().to(s.device)
        top, idx = crit.topk(k + 1, dim=-1)
        slope = (s * (1 - s)).gather(1, idx[:, k - 1:k + 1]).max(-1).values
        gap = (top[:, k - 1] - top[:, k]) / slope.clamp_min(1e-30)
    return gap / lg.pow(2).mean(-1).sqrt().clamp_min(1e-30)


def routing_stats(model, workloads: list, tie_band: float = 2.0 ** -5) -> RoutingStats:
    """Expert counts, margins and the near-tie share (margin within ``tie_band`` x (1 + d) for the router d
    layers deep in the slice, verify's band for bf16) of ``workloads`` under the current routers."""
    from persistent_engine.verification import verify
    from persistent_engine.ops import registry

    spec = model.spec
    if not spec.is_moe:
        return RoutingStats()
    calls: list[tuple] = []
    route = registry.current("moe_route")

    def record(*args):
        out = route(*args)
        calls.append((args[0], args[1], out[1]))
        return out

    per_layer: dict[int, list] = {}
    with registry.override({"moe_route": record}):
        for w in workloads:
            calls.clear()
            model.hidden(w)
            for j, c in enumerate(calls):
                per_layer.setdefault(j, []).append(c)
    counts, margins, near = [], [], []
    depths = verify.moe_depths(model)
    depths = depths if depths is not None and len(depths) == len(per_layer) else sorted(per_layer)
    for j in sorted(per_layer):
        ids = torch.cat([c[2].flatten().cpu() for c in per_layer[j]])
        counts.append(tuple(torch.bincount(ids, minlength=spec.num_experts).tolist()))
        m = torch.cat([_margins(c[0], c[1], spec.num_experts_per_tok, spec.scoring).cpu() for c in per_layer[j]])
        margins.append(round(float(m.median()), 4))
        near.append(round(float((m <= tie_band * (1 + max(j, depths[j]))).double().mean()), 4))
    return RoutingStats(counts=tuple(counts), margins=tuple(margins), near_tie=tuple(near))
