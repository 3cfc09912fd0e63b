"""Calibration: fit per-op-class efficiency factors from measured timings, per device.

A measurements file (JSON) is what the engine's timings produce:

    {"device": "h200",
     "measurements": [
        {"model": "llama-1b", "layers": [0, 1] | 2 | null, "dtype": "bf16",
         "layout": {"tp": 1, ...} (optional), "point": {"phase": "decode", "batch": 8, "context": 1024,
         "chunk": 1, "weight": 0.1}, "seconds": 0.00091, "op_class": "attention" (optional)}, ...]}

A row without ``op_class`` is a whole step (the sliced model's forward, embeddings and lm_head
included); with it, the time of that op class alone. ``impl`` (default "fused") says which kernels
ran: "reference" rows (the engine's plain-torch ops, what ``persistent_engine.measure.suite`` times) are costed
with the reference formulas of ``cost_model.ops``. ``graph`` (GPU rows): true when the step was
replayed from a CUDA graph, false when it ran eagerly (not capturable: prefill); an eager GPU row
also pays the host's per-kernel launch cost, a separate unknown ``e`` (CPU rows: none, their
``kernels`` term is the eager cost). The estimate is linear in the unknowns, in either of two forms
(cost_model.estimate):

    roofline  t = sum_c f_c * raw_c                          + (o + e [eager GPU]) * kernels * overhead_default
    split     t = sum_c (m_c * memory_c + k_c * compute_c)   + (o + e [eager GPU]) * kernels * overhead_default

so the factors and the overhead multiplier o are the bounded least-squares solution (each inside its
physical range, ``FitBounds``: no faster than the datasheet, 1-10 us per GPU kernel) of the
*relative* residuals (each row divided by its measurement), with a weak pull towards 1 so a class
the measurements barely exercise keeps its default. ``fit(form="auto")`` fits both and keeps the
one with the lower leave-one-out median error (the split form has twice the unknowns, so it must
earn them on rows it did not see): datacenter GPUs overlap memory and arithmetic (roofline), eager
CPU kernels stream and then compute (split), and small-batch GEMVs and large GEMMs of one class
need the split. The error before (all factors 1) and after is the median absolute relative error
over the rows.

Calibrations are stored per device as ``<device>.json`` in ``$TKCC_CALIBRATION_DIR`` (default
``~/.cache/tkcc/calibration``); the package ships measured ones in ``cost_model/calibrations/``.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from traffic_profiles import TrafficPoint

from cost_model.estimate import Efficiency, features
from cost_model.hardware import CostModelError, Hardware
from cost_model.layout import Layout
from cost_model.ops import IMPLS, OP_CLASSES, step_ops
from persistent_engine.models.spec import ModelSpec

PACKAGED_DIR = Path(__file__).with_name("calibrations")
RIDGE = 1e-4                    # pull of each factor towards 1 (relative units)
FORMS = ("roofline", "split")
# unknowns of each form, in feature order (the names of cost_model.estimate.features, then the overhead)
COLUMNS = {"roofline": (*OP_CLASSES, "kernels", "eager"),
           "split": (*(f"{c}:{part}" for c in OP_CLASSES for part in ("memory", "compute")), "kernels", "eager")}


def user_dir() -> Path:
    return Path(os.environ.get("TKCC_CALIBRATION_DIR") or Path.home() / ".cache" / "tkcc" / "calibration")


@dataclass(frozen=True)
class Measurement:
    model: str
    point: TrafficPoint          # stored as its map (to_dict / from_dict: the calibration file's boundary)
    seconds: float
    layers: list | None = None
    dtype: str = "bf16"
    layout: dict = field(default_factory=dict)
    op_class: str | None = None
    impl: str = "fused"             # "fused" | "reference" (cost_model.ops.IMPLS)
    graph: bool | None = None       # GPU: replayed from a CUDA graph (True) or eager (False); CPU: None

    @classmethod
    def from_dict(cls, d: dict) -> "Measurement":
        try:
            layers = d.get("layers")
            if isinstance(layers, int):
                layers = list(range(layers))
            m = cls(model=str(d["model"]), point=TrafficPoint.from_dict(d["point"]), seconds=float(d["seconds"]),
                    layers=layers,
                    dtype=str(d.get("dtype", "bf16")), layout=dict(d.get("layout") or {}),
                    op_class=d.get("op_class"), impl=str(d.get("impl") or "fused"),
                    graph=None if d.get("graph") is None else bool(d["graph"]))
        except (KeyError, TypeError, ValueError) as e:
            raise CostModelError(f"bad measurement {d!r}: {e}") from None
        if m.seconds <= 0 or (m.op_class is not None and m.op_class not in OP_CLASSES) or m.impl not in IMPLS:
            raise CostModelError(f"bad measurement {d!r}: seconds must be > 0, op_class one of {OP_CLASSES}, "
                                 f"impl one of {IMPLS}")
        return m

    def to_dict(self) -> dict:
        return {"model": self.model, "point": self.point.to_dict(), "seconds": self.seconds, "layers": self.layers,
                "dtype": self.dtype, "layout": self.layout, "op_class": self.op_class, "impl": self.impl,
                "graph": self.graph}


def feature_row(m: Measurement, hw: Hardware, specs: dict, form: str = "roofline") -> np.ndarray:
    """The unknowns' seconds at factor 1 for one measurement, in ``COLUMNS[form]`` order (the last
    two are kernels x the hardware's default overhead, and the same again for an eager GPU row)."""
    spec = specs.get(m.model) or specs.setdefault(m.model, ModelSpec.from_name(m.model))
    layout = Layout(**{**m.layout, "dtype": m.dtype})
    ops = step_ops(spec, layout, m.point, m.layers, impl=m.impl)
    if m.op_class is not None:
        ops = [o for o in ops if o.cls == m.op_class]
    f = features(ops, hw, layout.gpus)
    f["kernels"] *= hw.kernel_overhead_s
    f["eager"] = f["kernels"] if m.graph is False else 0.0
    return np.array([f[c] for c in COLUMNS[form]])


def _bvls(a: np.ndarray, b: np.ndarray, lo: np.ndarray, hi: np.ndarray, iters: int = 500) -> np.ndarray:
    """Bounded-variable least squares (Stark-Parker, an active set as in Lawson-Hanson):
    min |a x - b| subject to lo <= x <= hi. a [R, U], U small (<= 12 here); each step one
    lstsq over the free columns, so the cost is O(iters * R * U^2)."""
    n = a.shape[1]
    x = lo.astype(float).copy()                        # every variable starts at its lower bound
    free = np.zeros(n, dtype=bool)
    tol = 1e-12 * max(1.0, float(np.abs(a).max()) * float(np.abs(b).max()))
    for _ in range(iters):
        w = a.T @ (b - a @ x)                          # minus the gradient: which bound to leave
        movable = ~free & (((x <= lo) & (w > tol)) | ((x >= hi) & (w < -tol)))
        if not movable.any():
            break
        free[int(np.argmax(np.where(movable, np.abs(w), -np.inf)))] = True
        for _ in range(iters):
            z = x.copy()
            rhs = b - a[:, ~free] @ x[~free]
            z[free] = np.linalg.lstsq(a[:, free], rhs, rcond=None)[0]
            inside = free & ((z < lo) | (z > hi))
            if not inside.any():
                x = z
                break
            # step from x towards z until the first free variable reaches its bound; it leaves the free set
            d = z - x
            step = np.where(d < 0, (lo - x) / np.where(d < 0, d, -1.0), (hi - x) / np.where(d > 0, d, 1.0))
            alpha = float(np.clip(np.min(step[inside]), 0.0, 1.0))
            x = np.clip(x + alpha * d, lo, hi)
            free &= ~((x <= lo) | (x >= hi))
    return np.clip(x, lo, hi)


def relative_errors(pred: np.ndarray, meas: np.ndarray) -> np.ndarray:
    return np.abs(pred - meas) / meas


@dataclass(frozen=True)
class Calibration:
    device: str
    factors: dict                   # op class -> multiplier of the roofline time
    overhead_factor: float          # multiplier of hw.kernel_overhead_s
    kernel_overhead_s: float
    points: int
    error_before: float             # median absolute relative error, factors 1
    error_after: float
    source: str = ""
    form: str = "roofline"          # or "split": ``split`` holds the factors of every class
    split: dict = field(default_factory=dict)   # op class -> [memory factor, compute factor]
    eager_overhead_factor: float = 1.0          # extra multiplier of hw.kernel_overhead_s per eager GPU kernel
    loo_errors: dict = field(default_factory=dict)  # form -> leave-one-out median error ("auto" fits)

    @property
    def efficiency(self) -> Efficiency:
        return Efficiency(factors=dict(self.factors), kernel_overhead_s=self.kernel_overhead_s,
                          split={c: tuple(v) for c, v in self.split.items()})

    def vector(self) -> np.ndarray:
        """The factors in ``COLUMNS[self.form]`` order."""
        if self.form == "split":
            per = [self.split.get(c, (1.0, 1.0)) for c in OP_CLASSES]
            return np.array([f for mc in per for f in mc] + [self.overhead_factor, self.eager_overhead_factor],
                            dtype=float)
        return np.array([self.factors.get(c, 1.0) for c in OP_CLASSES]
                        + [self.overhead_factor, self.eager_overhead_factor])

    def predict(self, measurements: list[Measurement], hw: Hardware) -> np.ndarray:
        specs: dict = {}
        x = self.vector()
        return np.array([feature_row(m, hw, specs, self.form) @ x for m in measurements])

    def summary(self) -> dict:
        return {"device": self.device, "points": self.points, "form": self.form,
                "median_abs_error_before": round(self.error_before, 4),
                "median_abs_error_after": round(self.error_after, 4), "source": self.source}

    def to_dict(self) -> dict:
        return {"kind": "tkcc.calibration", "device": self.device, "form": self.form, "factors": self.factors,
                "split": {c: list(v) for c, v in self.split.items()},
                "overhead_factor": self.overhead_factor, "kernel_overhead_s": self.kernel_overhead_s,
                "eager_overhead_factor": self.eager_overhead_factor, "points": self.points,
                "error_before": self.error_before, "error_after": self.error_after,
                "loo_errors": self.loo_errors, "source": self.source}

    @classmethod
    def from_dict(cls, d: dict, source: str = "") -> "Calibration":
        if not isinstance(d, dict) or d.get("kind") != "tkcc.calibration":
            raise CostModelError(f"{source or 'calibration'}: not a tkcc calibration file")
        try:
            form = str(d.get("form", "roofline"))
            split = {str(c): [float(x) for x in v] for c, v in (d.get("split") or {}).items()}
            if form not in FORMS or any(len(v) != 2 for v in split.values()):
                raise ValueError(f"form must be one of {FORMS}, split factors pairs")
            return cls(device=str(d["device"]), factors={k: float(v) for k, v in d["factors"].items()},
                       overhead_factor=float(d["overhead_factor"]), kernel_overhead_s=float(d["kernel_overhead_s"]),
                       points=int(d["points"]), error_before=float(d["error_before"]),
                       error_after=float(d["error_after"]), source=source or str(d.get("source", "")),
                       form=form, split=split, eager_overhead_factor=float(d.get("eager_overhead_factor", 1.0)),
                       loo_errors={str(k): float(v) for k, v in (d.get("loo_errors") or {}).items()})
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise CostModelError(f"{source or 'calibration'}: incomplete calibration: {e}") from None

    def save(self, path: str | os.PathLike | None = None) -> Path:
        """Write atomically to ``path`` (default: the user directory, ``<device>.json``)."""
        path = Path(path) if path else user_dir() / f"{self.device}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(self.to_dict(), f, indent=1, sort_keys=True)
                f.write("\n")
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
        return path


def load_measurements(path: str | os.PathLike) -> tuple[str | None, list[Measurement]]:
    """(device, measurements) from a measurements JSON file."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CostModelError(f"cannot read measurements {path}: {e}") from None
    rows = doc.get("measurements") if isinstance(doc, dict) else doc
    if not isinstance(rows, list) or not rows:
        raise CostModelError(f"{path}: no measurements (expected {{\"measurements\": [...]}})")
    return (doc.get("device") if isinstance(doc, dict) else None), [Measurement.from_dict(r) for r in rows]


@dataclass(frozen=True)
class FitBounds:
    """The physical range of each unknown. A factor multiplies a time computed at the hardware's
    default efficiencies (``mem_bw = hbm_bw * mem_efficiency``, compute at ``compute_efficiency``
    of peak), so 100% of the datasheet ceiling is a memory factor of ``mem_efficiency`` and a
    compute factor of ``compute_efficiency``; a roofline factor mixes both and takes the lower.
    A factor below that would claim more than the hardware can do (0: the class is free)."""

    memory_min: float               # lowest memory-time factor (datasheet bandwidth)
    compute_min: float              # lowest compute-time factor (datasheet peak)
    factor_max: float               # highest factor of any class (lowest efficiency believed)
    kernel_s: tuple                 # (min, max) fixed seconds per kernel (graph replay on GPU)
    eager_s: tuple                  # (min, max) extra host launch seconds per kernel of an eager GPU step

    @classmethod
    def for_hardware(cls, hw: Hardware) -> "FitBounds":
        """GPU: at most the datasheet, at least 2% of it; 1-10 us per kernel in a CUDA graph,
        up to 20 us more per eagerly launched kernel. CPU: the probe's figures are DRAM ones and
        cached operands beat them, so factors only stay above 0.1; 0.1 us - 1 ms per eager op."""
        if hw.vendor == "cpu":
            return cls(memory_min=0.1, compute_min=0.1, factor_max=100.0, kernel_s=(0.1e-6, 1e-3),
                       eager_s=(0.0, 0.0))
        return cls(memory_min=hw.mem_efficiency, compute_min=hw.compute_efficiency, factor_max=50.0,
                   kernel_s=(1e-6, 10e-6), eager_s=(0.0, 20e-6))

    def box(self, form: str, hw: Hardware) -> tuple[np.ndarray, np.ndarray]:
        """(lower, upper) of the unknowns of ``form``, in ``COLUMNS[form]`` order."""
        lo = []
        for col in COLUMNS[form][:-2]:
            part = col.partition(":")[2]
            lo.append({"memory": self.memory_min, "compute": self.compute_min}.get(
                part, min(self.memory_min, self.compute_min)))
        hi = [self.factor_max] * len(lo)
        k = hw.kernel_overhead_s                       # the overhead columns are kernels x this
        lo += [self.kernel_s[0] / k, self.eager_s[0] / k]
        hi += [self.kernel_s[1] / k, self.eager_s[1] / k]
        return np.array(lo), np.array(hi)


def _solve(feats: np.ndarray, y: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Factors (one per column of ``feats`` [M, U] seconds at factor 1) minimising the relative
    residuals of ``y`` [M] inside the box [lo, hi], with a weak ridge pull towards 1 (collinear
    columns share their time instead of one of them dropping to its bound for a hair of residual);
    a column no row exercises keeps 1 (clipped into the box)."""
    a = feats / y[:, None]
    used = feats.max(axis=0) > 0
    k = int(used.sum())
    reg = np.sqrt(RIDGE) * np.eye(feats.shape[1])[used][:, used]
    x = np.clip(np.ones(feats.shape[1]), lo, hi)
    x[used] = _bvls(np.vstack([a[:, used], reg]), np.concatenate([np.ones(len(y)), np.sqrt(RIDGE) * np.ones(k)]),
                    lo[used], hi[used])
    return x


def _loo_error(feats: np.ndarray, y: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> float:
    """Median relative error of each row predicted by a fit on all the other rows. Cost: M fits."""
    errs = []
    for i in range(len(y)):
        keep = np.arange(len(y)) != i
        errs.append(abs(feats[i] @ _solve(feats[keep], y[keep], lo, hi) - y[i]) / y[i])
    return float(np.median(errs))


def fit(measurements: list, hw: Hardware, source: str = "", form: str = "auto",
        bounds: FitBounds | None = None) -> Calibration:
    """Fit the factors on ``measurements`` (Measurement or dicts) for device ``hw`` inside
    ``bounds`` (default ``FitBounds.for_hardware(hw)``); ``form`` is "roofline", "split", or
    "auto" (the one with the lower leave-one-out error; roofline on a tie or with fewer than 4 rows)."""
    ms = [m if isinstance(m, Measurement) else Measurement.from_dict(m) for m in measurements]
    if len(ms) < 2:
        raise CostModelError("calibration needs at least 2 measurements")
    if form not in (*FORMS, "auto"):
        raise CostModelError(f"unknown calibration form {form!r}; use one of {', '.join(FORMS)} or auto")
    specs: dict = {}
    y = np.array([m.seconds for m in ms])
    feats = {f: np.array([feature_row(m, hw, specs, f) for m in ms]) for f in FORMS}   # [M, unknowns] seconds
    box = {f: (bounds or FitBounds.for_hardware(hw)).box(f, hw) for f in FORMS}
    loo = {}
    if form == "auto":
        form = "roofline"
        if len(ms) >= 4:
            loo = {f: _loo_error(feats[f], y, *box[f]) for f in FORMS}
            form = "split" if loo["split"] < loo["roofline"] else "roofline"
    x = _solve(feats[form], y, *box[form])
    before = float(np.median(relative_errors(feats["roofline"].sum(axis=1), y)))
    after = float(np.median(relative_errors(feats[form] @ x, y)))
    if form == "split":
        factors = {c: 1.0 for c in OP_CLASSES}
        split = {c: [float(x[2 * i]), float(x[2 * i + 1])] for i, c in enumerate(OP_CLASSES)}
    else:
        factors, split = {c: float(x[i]) for i, c in enumerate(OP_CLASSES)}, {}
    return Calibration(device=hw.name, factors=factors, overhead_factor=float(x[-2]),
                       kernel_overhead_s=float(x[-2] * hw.kernel_overhead_s), points=len(ms),
                       error_before=before, error_after=after, source=source, form=form, split=split,
                       eager_overhead_factor=float(x[-1]), loo_errors=loo)


def evaluate(calib: Calibration | None, measurements: list, hw: Hardware) -> dict:
    """Median and mean absolute relative error of ``calib`` (None: uncalibrated) on held-out rows."""
    ms = [m if isinstance(m, Measurement) else Measurement.from_dict(m) for m in measurements]
    y = np.array([m.seconds for m in ms])
    if calib is None:
        specs: dict = {}
        pred = np.array([feature_row(m, hw, specs).sum() for m in ms])
    else:
        pred = calib.predict(ms, hw)
    err = relative_errors(pred, y)
    return {"median_abs_error": float(np.median(err)), "mean_abs_error": float(err.mean()),
            "predicted_s": pred.tolist(), "measured_s": y.tolist()}


def load_calibration(device: str, path: str | os.PathLike | None = None) -> Calibration | None:
    """``path`` when given; else the user's stored calibration for ``device``, else the packaged
    one, else None (uncalibrated)."""
    candidates = [Path(path)] if path else [user_dir() / f"{device}.json", PACKAGED_DIR / f"{device}.json"]
    for p in candidates:
        if p.exists():
            try:
                return Calibration.from_dict(json.loads(p.read_text()), source=str(p))
            except (json.JSONDecodeError, UnicodeDecodeError, OSError) as e:
                raise CostModelError(f"cannot read calibration {p}: {e}") from None
        if path:
            raise CostModelError(f"calibration file not found: {path}")
    return None

