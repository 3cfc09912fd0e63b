"""persistent_engine.parallel: tensor- and expert-parallel slices of the decoder over torch.distributed
(NCCL on GPUs, gloo on CPU), the process launcher, and the check against the single-process reference.

    from persistent_engine.parallel import ParallelConfig, build_sharded, launch, check_sharded

Loaded lazily: importing this package does not import torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "ParallelError": "group", "SAFE_ENV": "group", "all_reduce": "group", "all_gather_last": "group",
    "free_port": "group", "launch": "group", "pick_backend": "group",
    "ParallelConfig": "tensor_parallel", "TPDecoder": "tensor_parallel", "build_sharded": "tensor_parallel",
    "check_supported": "tensor_parallel", "kv_head_range": "tensor_parallel", "local_spec": "tensor_parallel",
    "shard_cache": "tensor_parallel", "shard_model": "tensor_parallel", "shard_params": "tensor_parallel",
    "shard_tensor": "tensor_parallel", "shard_workload": "tensor_parallel",
    "check_sharded": "check", "compare_worker": "check",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"persistent_engine.parallel.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'persistent_engine.parallel' has no attribute {name!r}")
