"""The runtime of a vLLM plugin package written by ``tkcc plan export --to vllm`` (copied into it as
``runtime.py``; it imports only torch, and vLLM inside ``register_plan``, never tkcc).

vLLM calls the package's ``register()`` (entry point group ``vllm.general_plugins``) in every process
that builds a model. ``register_plan(package_dir)`` reads ``manifest.json``, checks every kernel file
against the sha256 it records, imports each kernel module and registers, per vLLM layer class the plan
replaces, a subclass with ``CustomOp.register_oot`` (vLLM then builds the subclass wherever a model
builds the layer). The subclass's ``forward`` calls the plan's kernel through the op's adapter
(``ADAPTERS``: vLLM's forward signature -> tkcc's op signature) when the call is one the kernel was
verified on, and vLLM's own forward (``super().forward``: vLLM's dispatch) for everything else:

  every op   dtype not among the manifest's ``dtypes`` (tkcc's op contract checks float32 and bfloat16);
             a Triton kernel on a tensor that is not on a GPU (Triton has no CPU backend inside vLLM)
  norms      last dim not one the plan's model feeds the op; no weight; ``var_hidden_size``; weight dtype
             other than the input's
  activations  last dim (2 x intermediate) not the model's; GeluAndMul other than ``approximate="tanh"``
  rotary     ``key`` None; not neox style; head size / rotary dim not the model's

Counting: with ``TKCC_VLLM_COUNTS=DIR`` every process writes ``DIR/counts-<pid>.json`` after each call,
``{op: {"kernel": n, "fallback": m}}`` (eager mode; calls traced by torch.compile are not counted).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable

MANIFEST = "manifest.json"
FALLBACK = object()             # an adapter's answer for a call its kernel does not cover
_COUNTS: dict[str, dict[str, int]] = {}
_log = logging.getLogger("vllm.tkcc_plan")


# ---------------------------------------------------------------- counting
def count(op: str, how: str) -> None:
    """One call of ``op`` ran the plan's ``kernel`` or vLLM's own forward (``fallback``)."""
    where = os.environ.get("TKCC_VLLM_COUNTS")
    if not where:
        return
    import torch

    if torch.compiler.is_compiling():
        return
    per = _COUNTS.setdefault(op, {"kernel": 0, "fallback": 0})
    per[how] += 1
    path = Path(where) / f"counts-{os.getpid()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(_COUNTS, sort_keys=True))
    os.replace(tmp, path)


# ---------------------------------------------------------------- kernels
class Kernel:
    """One exported op: its callable (the kernel module's ``OVERRIDES[op]``) and what it was verified on."""

    def __init__(self, op: str, fn: Callable, entry: dict):
        self.op, self.fn = op, fn
        self.dtypes = frozenset(entry["dtypes"])               # torch dtype names, "float32"
        self.dims = {tuple(d) if isinstance(d, list) else d for d in entry["dims"]}
        self.needs_gpu = bool(entry["needs_gpu"])

    def covers(self, x: Any, dims: Any) -> bool:
        """True when a call with input ``x`` and trailing ``dims`` is one the kernel was verified on."""
        return (str(x.dtype).removeprefix("torch.") in self.dtypes and dims in self.dims
                and (x.is_cuda or not self.needs_gpu))


def _load_kernel(package: Path, entry: dict) -> Callable:
    path = package / entry["kernel"]
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise ValueError(f"{entry['kernel']} does not match its sha256 in {MANIFEST}")
    # its importable name (torch.compile's generated code and caches import the kernel's module by name)
    name = f"{package.name}.{Path(entry['kernel']).with_suffix('').as_posix().replace('/', '.')}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name].OVERRIDES[entry["op"]]


# ---------------------------------------------------------------- adapters (vLLM forward -> tkcc op)
def rms_norm_adapter(layer: Any, kernels: dict[str, Kernel], x: Any, residual: Any = None) -> Any:
    """RMSNorm.forward(x, residual=None) -> rms_norm(x, w, eps) | fused_add_rms_norm(x, residual, w, eps)
    (both return what vLLM returns: y, or (y, x + residual))."""
    op = "rms_norm" if residual is None else "fused_add_rms_norm"
    k = kernels.get(op)
    if k is None:
        return op, FALLBACK
    ok = (layer.has_weight and layer.variance_size_override is None and layer.weight.dtype == x.dtype
          and k.covers(x, x.shape[-1])
          and (residual is None or (residual.dtype == x.dtype and residual.shape == x.shape)))
    if not ok:
        return op, FALLBACK
    if residual is None:
        return op, k.fn(x, layer.weight, layer.variance_epsilon)
    out, res = k.fn(x, residual, layer.weight, layer.variance_epsilon)
    return op, (out, res)


def glu_adapter(op: str) -> Callable:
    """SiluAndMul / GeluAndMul(approximate="tanh").forward(x[..., 2I]) -> op(x) [..., I]."""
    def adapter(layer: Any, kernels: dict[str, Kernel], x: Any) -> Any:
        k = kernels.get(op)
        if k is None or getattr(layer, "approximate", "tanh") != "tanh" or not k.covers(x, x.shape[-1]):
            return op, FALLBACK
        return op, k.fn(x)
    return adapter


def rotary_adapter(layer: Any, kernels: dict[str, Kernel], positions: Any, query: Any, key: Any = None) -> Any:
    """RotaryEmbedding.forward(positions, query[T, Hq*Dh], key[T, Hk*Dh]) -> rotary_embedding(positions[T],
    q[T, Hq, Dh], k[T, Hk, Dh], cos_sin_cache[P, R], R), reshaped back to query's and key's shapes."""
    op = "rotary_embedding"
    k = kernels.get(op)
    if (k is None or key is None or not layer.is_neox_style or key.dtype != query.dtype
            or not k.covers(query, (layer.head_size, layer.rotary_dim))):
        return op, FALLBACK
    pos = positions.flatten()
    t, dh = pos.shape[0], layer.head_size
    match = getattr(layer, "_match_cos_sin_cache_dtype", None)     # vLLM's own cache dtype/device match
    cache = match(query) if match is not None else layer.cos_sin_cache.to(query.device, query.dtype)
    q, kk = k.fn(pos, query.reshape(t, -1, dh), key.reshape(t, -1, dh), cache, layer.rotary_dim)
    return op, (q.reshape(query.shape), kk.reshape(key.shape))


ADAPTERS: dict[str, Callable] = {
    "rms_norm": rms_norm_adapter,
    "silu_and_mul": glu_adapter("silu_and_mul"),
    "gelu_tanh_and_mul": glu_adapter("gelu_tanh_and_mul"),
    "rotary_embedding": rotary_adapter,
}


# ---------------------------------------------------------------- registration
def _oot_class(base: type, adapter: Callable, kernels: dict[str, Kernel]) -> type:
    def forward(self, *args, **kwargs):
        op, out = adapter(self, kernels, *args, **kwargs)
        if out is FALLBACK:
            count(op, "fallback")
            return super(cls, self).forward(*args, **kwargs)
        count(op, "kernel")
        return out

    cls = type(f"Tkcc{base.__name__}", (base,), {"forward": forward, "__module__": __name__})
    return cls


def _import_layer(module: str, name: str) -> type | None:
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def register_plan(package: str | os.PathLike) -> list[str]:
    """Registers the package's kernels with vLLM (idempotent per process); returns the vLLM layer class
    names now replaced. A kernel whose file fails its sha256 or its import is skipped with an error in the
    log (vLLM's own forward then runs for its op)."""
    from vllm.model_executor.custom_op import CustomOp, op_registry_oot

    package = Path(package)
    manifest = json.loads((package / MANIFEST).read_text())
    kernels: dict[str, Kernel] = {}
    for entry in manifest["exported"]:
        try:
            kernels[entry["op"]] = Kernel(entry["op"], _load_kernel(package, entry), entry)
        except Exception as e:  # noqa: BLE001 - any failure leaves vLLM's forward in place
            _log.error("tkcc plan %s: kernel for %s not loaded (%s: %s); vLLM's own forward runs",
                       manifest["plan"], entry["op"], type(e).__name__, e)
    replaced = []
    for layer in manifest["layers"]:
        ops = [op for op in layer["ops"] if op in kernels]
        base = _import_layer(layer["module"], layer["class"])
        if not ops or base is None or not issubclass(base, CustomOp):
            continue
        if base.__name__ in op_registry_oot:
            if not getattr(op_registry_oot[base.__name__], "__name__", "").startswith("Tkcc"):
                _log.warning("tkcc plan: %s already replaced by another plugin; left as is", base.__name__)
            continue
        base.register_oot(_oot_class(base, ADAPTERS[layer["adapter"]], kernels))
        replaced.append(base.__name__)
    _log.info("tkcc plan %s: %s replaced (%s)", manifest["plan"], ", ".join(replaced) or "no layer",
              ", ".join(sorted(kernels)))
    return replaced
