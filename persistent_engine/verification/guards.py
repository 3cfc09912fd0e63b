"""Run-time guards against a candidate that cheats outside its outputs (reference README, items 2, 5).

* ``GlobalStateGuard``: a snapshot, taken at engine start before any candidate code ran, of the
  attribute tables of the modules and classes a candidate could patch to fool the engine (``torch``,
  ``torch.Tensor``, ``torch.cuda.Event``, ``time``, the op registry, the engine's own timing module)
  plus global torch settings (default dtype, grad mode, threads, TF32, determinism) and the global RNG
  states. ``check()`` names every difference; ``restore()`` puts the snapshot back so the next
  candidate starts clean. Cost: one dict compare of ~10k entries, < 5 ms.
* ``ThreadGuard``: Python threads alive now that were not at the snapshot.
* ``TensorGuard``: exact copies of tensors that must not change (the weights, the workload's inputs
  and KV cache); ``changed()`` names the changed ones (``torch.equal``, one pass over the bytes),
  ``restore()`` copies the originals back. Memory: one extra copy of the guarded tensors, on the device,
  or in host memory with a device-side fingerprint per tensor when they exceed a device budget.
* ``CacheRows``: the paged K/V pools of a workload outside its new tokens' rows (``slot_mapping``), kept before
  a layer-level step of a candidate that declares in-place cache writes; ``changed()`` names the pools whose
  other rows the step wrote.
* Verdict checks: ``Counted`` / ``never_called`` (the "kernel actually ran" guard: an override the model
  never calls is rejected) and ``min_step_bytes`` / ``implausibly_fast`` (the roofline: a step faster than
  its minimum bytes allow at the peak bandwidth is rejected).
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from collections.abc import Iterable
from types import ModuleType

import torch

_MISSING = object()
_PLAIN_DATA = (dict, list, set, tuple, int, float, str, bytes, bool, type(None))


def _settings() -> dict[str, object]:
    """Global torch switches a candidate could flip to change numerics or timing."""
    s: dict[str, object] = {
        "default_dtype": torch.get_default_dtype(),
        "grad_enabled": torch.is_grad_enabled(),
        "num_threads": torch.get_num_threads(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
        "cudnn.benchmark": torch.backends.cudnn.benchmark,
        "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
    }
    return s


def _set_setting(name: str, value) -> None:
    setters = {
        "default_dtype": torch.set_default_dtype,
        "grad_enabled": torch.set_grad_enabled,
        "num_threads": torch.set_num_threads,
        "deterministic_algorithms": torch.use_deterministic_algorithms,
        "float32_matmul_precision": torch.set_float32_matmul_precision,
    }
    if name in setters:
        setters[name](value)
    elif name == "cudnn.allow_tf32":
        torch.backends.cudnn.allow_tf32 = value
    elif name == "cudnn.benchmark":
        torch.backends.cudnn.benchmark = value
    elif name == "cuda.matmul.allow_tf32":
        torch.backends.cuda.matmul.allow_tf32 = value


def _rng_states() -> tuple[torch.Tensor, int | None]:
    """The CPU generator's full state, and the CUDA default generator's seed (its philox offset
    moves with CUDA-graph bookkeeping, so only a re-seed is looked for there)."""
    cuda_seed = torch.cuda.initial_seed() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda_seed


class GlobalStateGuard:
    """``namespaces``: modules (non-data attributes watched), classes and plain objects (every
    attribute watched, additions included: the model and its layer objects go here)."""

    def __init__(self, namespaces: Iterable[object]):
        self._namespaces = [ns for ns in namespaces if ns is not None]
        self.snapshot()

    def snapshot(self) -> None:
        # modules: everything but plain data (caches and counters change as the libraries run);
        # classes: every attribute
        self._tables = [(ns, {k: v for k, v in vars(ns).items() if not isinstance(v, _PLAIN_DATA)}
                         if isinstance(ns, ModuleType) else dict(vars(ns))) for ns in self._namespaces]
        self._settings = _settings()
        self._rng = _rng_states()

    def _diff(self):
        for ns, table in self._tables:
            now = vars(ns)
            if isinstance(ns, ModuleType):
                label = ns.__name__
            elif isinstance(ns, type):
                label = f"{ns.__module__}.{ns.__qualname__}"
            else:
                label = f"<{type(ns).__name__} object>"
            for key, value in table.items():
                cur = now.get(key, _MISSING)
                if cur is not value:
                    yield ns, key, value, f"{label}.{key}"
            if not isinstance(ns, ModuleType):  # a new attribute shadows a class's or an inherited one
                for key in now.keys() - table.keys():
                    yield ns, key, _MISSING, f"{label}.{key}"

    def check(self) -> list[str]:
        """Names of everything that differs from the snapshot (empty when untouched)."""
        changed = [name for *_, name in self._diff()]
        now = _settings()
        changed += [f"torch setting {k}: {self._settings[k]!r} -> {now[k]!r}"
                    for k in self._settings if now[k] != self._settings[k]]
        cpu, cuda_seed = _rng_states()
        if not torch.equal(cpu, self._rng[0]) or cuda_seed != self._rng[1]:
            changed.append("global RNG state")
        return changed

    def restore(self) -> list[str]:
        restored = []
        for ns, key, value, name in list(self._diff()):
            try:
                if value is _MISSING:
                    delattr(ns, key)
                else:
                    setattr(ns, key, value)
                restored.append(name)
            except (AttributeError, TypeError):
                pass
        now = _settings()
        for k, v in self._settings.items():
            if now[k] != v:
                _set_setting(k, v)
                restored.append(f"torch setting {k}")
        torch.set_rng_state(self._rng[0])
        if self._rng[1] is not None and torch.cuda.initial_seed() != self._rng[1]:
            torch.cuda.manual_seed_all(self._rng[1])
        return restored


def default_namespaces() -> list[ModuleType | type]:
    """What a candidate could patch to fool inputs, clocks, synchronisation or the registry."""
    names = ["torch", "torch.nn.functional", "torch.cuda", "torch.random", "torch.functional",
             "torch._C", "torch._C._VariableFunctions", "time", "math", "threading",
             "persistent_engine.measure.timing", "persistent_engine.verification.guards",
             "persistent_engine.verification.verify",
             "persistent_engine.ops", "persistent_engine.ops.registry", "persistent_engine.ops.contract",
             "persistent_engine.inputs.workloads", "persistent_engine.models.decoder",
             "persistent_engine.models.attention", "persistent_engine.models.mla",
             "persistent_engine.models.moe", "persistent_engine.models.rope",
             "persistent_engine.models.kv_cache", "triton", "triton.runtime.jit"]
    spaces: list[ModuleType | type] = [sys.modules[n] for n in names if n in sys.modules]
    spaces += [torch.Tensor, torch.nn.Module, torch.cuda.Event, torch.cuda.Stream, torch.cuda.CUDAGraph]
    return spaces


def _library_thread(t: threading.Thread) -> bool:
    """A worker that torch or Triton start themselves (e.g. Triton's compile pool on a first compile)."""
    target = getattr(t, "_target", None)
    module = getattr(target, "__module__", "") or ""
    return module.split(".")[0] in ("torch", "triton")


class ThreadGuard:
    def __init__(self):
        self.snapshot()

    def snapshot(self) -> None:
        self._idents = {t.ident for t in threading.enumerate()}

    def new_threads(self, wait_s: float = 0.05) -> list[str]:
        """Threads started since the snapshot that are still alive (after a short grace period)."""
        deadline = time.monotonic() + wait_s
        while True:
            extra = [t for t in threading.enumerate()
                     if t.ident not in self._idents and t.is_alive() and not _library_thread(t)]
            if not extra or time.monotonic() >= deadline:
                return [t.name for t in extra]
            time.sleep(0.005)


FINGERPRINT_ROW = 1 << 12                # int32 words per fingerprint row
FINGERPRINT_CHUNK = 1 << 24              # words hashed at once (a 128 MiB int64 temporary)


@functools.lru_cache(maxsize=None)
def _multipliers(n: int, device: torch.device, seed: int) -> torch.Tensor:
    """n odd pseudo-random int64 multipliers on ``device`` (made once per (n, device, seed))."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(1, 2 ** 62, (n,), generator=g, dtype=torch.int64) | 1).to(device)


def fingerprint(t: torch.Tensor, seed: int = 0x7C0C) -> torch.Tensor:
    """A position-keyed hash of a tensor's bytes, computed where the tensor lives ([1] int64, wrapping
    arithmetic): each int32 word times a pseudo-random odd multiplier of its column, each row's sum times
    one of its row. Any single changed word, and any swap of words, rows or chunks, changes it (up to
    collisions of a 64-bit hash). Cost: one read of the tensor, int64 temporaries of FINGERPRINT_CHUNK."""
    raw = t.detach().contiguous().reshape(-1).view(torch.uint8)
    if raw.numel() % 4:
        raw = torch.cat([raw, raw.new_zeros(4 - raw.numel() % 4)])
    words = raw.view(torch.int32)
    cols = _multipliers(FINGERPRINT_ROW, t.device, seed)
    acc = torch.zeros((), dtype=torch.int64, device=t.device)
    for c0 in range(0, words.numel(), FINGERPRINT_CHUNK):
        w = words[c0:c0 + FINGERPRINT_CHUNK].to(torch.int64)
        if w.numel() % FINGERPRINT_ROW:
            w = torch.cat([w, w.new_zeros(FINGERPRINT_ROW - w.numel() % FINGERPRINT_ROW)])
        rows = (w.view(-1, FINGERPRINT_ROW) * cols).sum(1)                       # [R] int64
        acc += (rows * _multipliers(rows.numel(), t.device, seed + 1 + c0 // FINGERPRINT_CHUNK)).sum()
    return acc.reshape(1)


def host_bytes_available() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where it cannot be read)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class TensorGuard:
    """Copies of tensors that must not change. Normally exact copies beside them (``changed`` compares
    with ``torch.equal``). With ``device_budget`` (bytes) exceeded, ``changed`` compares a ``fingerprint``
    computed on the device instead, so a guarded set as large as the weights of a DeepSeek slice does not
    double its device memory (an H200 ran out of memory starting deepseek's two tiers that way), and the
    copies go to host memory when they take at most half of what it has available (two engines share a
    host); otherwise none are kept and ``restorable`` is False: the owner must replace what changed
    (the engine then leaves, and the supervisor starts a fresh one)."""

    def __init__(self, tensors: dict[str, torch.Tensor], device_budget: int | None = None,
                 host_available: int | None = None):
        self._live = dict(tensors)
        nbytes = sum(t.numel() * t.element_size() for t in self._live.values())
        self.on_host = device_budget is not None and nbytes > device_budget
        self._copy: dict[str, torch.Tensor] | None
        if self.on_host:
            room = host_bytes_available() if host_available is None else host_available
            keep = room is None or nbytes <= room // 2
            self._copy = {k: t.detach().to("cpu", copy=True) for k, t in self._live.items()} if keep else None
            self._seed = int.from_bytes(os.urandom(4), "little") | 1   # a key no executor sees
            self._fp = {k: fingerprint(t, self._seed) for k, t in self._live.items()}
        else:
            self._copy = {k: t.detach().clone() for k, t in self._live.items()}

    @property
    def restorable(self) -> bool:
        return self._copy is not None

    def changed(self) -> list[str]:
        if self.on_host:
            return [k for k, t in self._live.items() if not torch.equal(fingerprint(t, self._seed), self._fp[k])]
        return [k for k, t in self._live.items() if not torch.equal(t, self._copy[k])]

    def restore(self, names: Iterable[str] | None = None) -> None:
        if self._copy is None:
            raise RuntimeError("no copies kept (host memory): the guarded tensors cannot be restored")
        with torch.no_grad():
            for k in (self._live if names is None else names):
                self._live[k].copy_(self._copy[k])

    def __len__(self) -> int:
        return len(self._live)


# ----------------------------------------------------------------------------- verdict checks
class Counted:
    """An override wrapped to count its calls (the "kernel actually ran" guard)."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args):
        self.calls += 1
        return self.fn(*args)


class CacheRows:
    """Every paged pool of ``workload.cache`` (``k``, ``v``, ``index_k``: [NB, BS, ...] per layer) except the
    rows ``workload.slot_mapping`` a step writes by design (the new tokens' K/V; what a region op declares,
    ``OpDef.writes``): copied now, compared by ``changed()``. Memory: one copy of those pools."""

    def __init__(self, workload):
        cache, slots = workload.cache, workload.slot_mapping.long()
        self.rows: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        for kind in ("k", "v", "index_k"):
            for layer, pool in getattr(cache, kind).items():
                flat = pool.view(pool.shape[0] * pool.shape[1], *pool.shape[2:])
                keep = torch.ones(flat.shape[0], dtype=torch.bool, device=flat.device)
                keep[slots] = False
                self.rows[f"{kind}[{layer}]"] = (flat, keep, flat[keep].clone())

    def changed(self) -> list[str]:
        """Pools with a row outside the new tokens' changed (one host sync)."""
        if not self.rows:
            return []
        flags = torch.stack([_same(flat[keep], before) for flat, keep, before in self.rows.values()])
        return [name for name, ok in zip(self.rows, flags.tolist()) if not ok]


def _same(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Bitwise equal as a device bool (NaN equal to NaN at the same place)."""
    if a.is_floating_point():
        return ((a == b) | (a.isnan() & b.isnan())).all()
    return (a == b).all()


def never_called(counted: dict, ops_at: list[set]) -> list[str]:
    """The "kernel actually ran" guard: a reason per override the model does not call at any point,
    or whose implementation did not run in the layer-level steps (``counted``: op -> Counted)."""
    reasons = []
    for name, fn in sorted(counted.items()):
        if not any(name in at for at in ops_at):
            reasons.append(f"layer-level: override {name} never called: the model does not call {name} "
                           "at any workload point")
        elif fn.calls == 0:
            reasons.append(f"layer-level: override {name} never called: its implementation did not run "
                           "in any layer-level step")
    return reasons


def min_step_bytes(weights: dict, workload, spec) -> int:
    """Bytes one step must read at the least (``weights``: name -> tensor of the model slice): every weight but the embedding table (gathered by
    rows), MoE expert tensors only at k/E (a step uses at least k experts), plus each sequence's
    cached K/V of every layer (context_lens tokens; sparse attention reads at most its selection's tokens of
    the attended pools: index_topk for DSA, topk_blocks x block size for MiniMax-M3). A lower bound, never an
    estimate."""
    total = 0
    e, k = getattr(spec, "num_experts", 0) or 0, getattr(spec, "num_experts_per_tok", 0) or 0
    for name, t in weights.items():
        if "embed" in name or name == "cos_sin":
            continue
        nbytes = t.numel() * t.element_size()
        if e and k and t.dim() == 3 and t.shape[0] == e:
            nbytes = nbytes * k // e
        total += nbytes
    lens = workload.context_lens.long()
    tokens = int(lens.sum())
    cap = getattr(spec, "index_topk", 0) or getattr(spec, "msa_topk_blocks", 0) * getattr(spec, "msa_block_size", 0)
    selected = int(lens.clamp(max=cap).sum()) if cap else tokens
    for pools in (workload.cache.k, workload.cache.v, workload.cache.index_k):
        for layer, pool in pools.items():
            # the attended pools of a sparse layer (DSA: the MLA latent in k; M3: k and v) are read at the selection
            attended = (getattr(spec, "index_topk", 0) and pools is workload.cache.k) or \
                (getattr(spec, "msa_layers", ()) and spec.block_sparse(layer) and pools is not workload.cache.index_k)
            total += (selected if attended else tokens) * pool[0, 0].numel() * pool.element_size()
    return total


def implausibly_fast(label: str, step_ms: float, floor_ms: float) -> str | None:
    """The roofline check: None when ``step_ms`` is at or above ``floor_ms``."""
    if floor_ms > 0 and step_ms < floor_ms:
        return f"timing: implausibly fast at {label}: {step_ms:.4g} ms < floor {floor_ms:.4g} ms"
    return None


# ------------------------------------------------------------------------------ what the tensor guards watch
def tensors_of(obj, prefix: str = "", depth: int = 0, seen: set | None = None) -> dict[str, torch.Tensor]:
    """Every tensor reachable through attributes, lists and dicts of ``obj`` (workload objects)."""
    seen = set() if seen is None else seen
    out: dict[str, torch.Tensor] = {}
    if isinstance(obj, torch.Tensor):
        if id(obj) not in seen:
            seen.add(id(obj))
            out[prefix or "tensor"] = obj
        return out
    if depth > 4 or id(obj) in seen:
        return out
    seen.add(id(obj))
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    elif hasattr(obj, "__dict__"):
        items = vars(obj).items()
    else:
        return out
    for k, v in items:
        out.update(tensors_of(v, f"{prefix}.{k}" if prefix else str(k), depth + 1, seen))
    return out


def model_weights(model) -> dict[str, torch.Tensor]:
    """Every tensor of the model that no step may change: parameters (and the rotary table)."""
    params = getattr(model, "params", None)
    if isinstance(params, dict) and params:
        named = dict(params)
        if isinstance(getattr(model, "cos_sin", None), torch.Tensor):
            named["cos_sin"] = model.cos_sin
        return named
    if isinstance(model, torch.nn.Module):
        named = dict(model.named_parameters())
        named.update(dict(model.named_buffers()))
        if named:
            return {k: v for k, v in named.items()}
    return tensors_of(model)
