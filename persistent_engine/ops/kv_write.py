"""The step's K/V rows into a paged pool: ``write_kv(pool, slots, rows)`` (models/kv_cache.py says why).

Reads ``values`` [T, *row] and ``slots`` [T] int64 (flat block * BS + offset); writes T rows of ``cache``
[NB, BS, *row] and nothing else. Eagerly (and under CUDA-graph capture) a plain ``index_copy_`` into the
pool's flat view; under ``torch.compile`` the opaque custom op ``tkcc::kv_write``, declared to mutate the
pool, so inductor calls it in place instead of copying the whole pool. Used by every model layer and by the
region ops (ops/layers.py), which the compiled serving variant traces too.
"""

from __future__ import annotations

import torch

__all__ = ["kv_write", "write_kv"]


@torch.library.custom_op("tkcc::kv_write", mutates_args=("cache",))
def kv_write(cache: torch.Tensor, slots: torch.Tensor, values: torch.Tensor) -> None:
    """``cache``: a pool [NB, BS, *row]; ``slots`` [T] int64 flat slots; ``values`` [T, *row] (may be a
    strided view): row t goes to slot ``slots[t]``. Writes T rows, reads nothing of the pool."""
    cache.view(-1, *values.shape[1:]).index_copy_(0, slots, values)


@kv_write.register_fake
def _kv_write_fake(cache: torch.Tensor, slots: torch.Tensor, values: torch.Tensor) -> None:
    return None


def write_kv(cache: torch.Tensor, slots: torch.Tensor, values: torch.Tensor) -> None:
    """Writes the step's rows ``values`` [T, *row] into the pool ``cache`` [NB, BS, *row] at ``slots``.
    Eager (and CUDA-graph capture) runs ``index_copy_`` directly: the custom op's dispatch costs ~20 us a
    call on CPU (``index_copy_`` ~4 us; 32 writes a llama-1b step), checking ``is_compiling`` < 1 us."""
    if torch.compiler.is_compiling():
        torch.ops.tkcc.kv_write(cache, slots, values)
    else:
        cache.view(-1, *values.shape[1:]).index_copy_(0, slots, values)
