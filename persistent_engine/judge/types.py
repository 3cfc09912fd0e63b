"""The judge's types and constants, imported by every stage of the judge (``engine``, ``executors``,
``checks``, ``ab``) so that none of them imports another for a type: the engine's configuration, the
loaded candidate, the error a candidate raised, and the per-device constants."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from persistent_engine.io_struct import WorkloadPoint

if TYPE_CHECKING:
    from persistent_engine.executor.launch import Executor

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# what the engine does with each CONFIG knob, as reported in the load and bench replies
CONFIG_NOTES = {
    "cuda_graph": "applied: candidate points captured in CUDA graphs (CUDA only)",
    "cuda_graph_batch_sizes": "applied: only points of these batch sizes are graphed on the candidate side",
    "kv_block_size": "applied: the candidate's KV caches re-laid with this block size",
    "max_num_seqs": "not measurable by the engine; judged by compiler config search",
    "max_num_batched_tokens": "not measurable by the engine; judged by compiler config search",
    "max_chunk_tokens": "not measurable by the engine; judged by compiler config search",
}
# roofline floor: bytes a step must read at least / this bandwidth (GB/s); CUDA when unset
DEFAULT_PEAK_BANDWIDTH_GBS = {"cuda": 5000.0}
# the pool's executors SIGSTOPped while a point is timed once at least this many are warm (a warming one's
# imports take a core from the timed sides: on the 2-core CI machine an A/A read 0.4-3.4x with the pool
# warming, 1.00-1.05 with it paused); always on CPU, on CUDA only while the pool is ahead (it must keep warming)
PAUSE_POOL_IF_READY = {"cpu": 0, "cuda": 2}
ARENA_CHUNKS_PER_CHECK = 4             # arena chunks (16 MiB each) re-hashed after every candidate
DEVICE_ERRORS = ("CUDA error", "illegal memory access", "device-side assert", "CUBLAS_STATUS",
                 "unspecified launch failure", "misaligned address", "illegal instruction")


@dataclass(frozen=True)
class EngineConfig:
    model: str
    layers: list[int] | None = None     # None: every layer
    device: str = "cpu"
    dtype: str = "bf16"
    points: list[WorkloadPoint] = field(default_factory=list)   # empty: default_points(device)
    seed: int = 0
    variants: int = 2                   # input variants per point (fresh inputs across samples)
    cuda_graph: bool = True
    # roofline plausibility floor (GB/s): None = DEFAULT_PEAK_BANDWIDTH_GBS of the device (off on CPU)
    peak_bandwidth_gbs: float | None = None
    pool_size: int | None = None        # warm candidate executors (None: POOL_SIZE of the device)
    inputs: dict = field(default_factory=dict)     # tier_inputs.TierInputs as JSON ({}: uniform, random routers)
    # bytes of weights the other engines on this device hold or will hold (the other tier's slice on a
    # one-GPU run; 0: this engine is alone): kept out of the pool and the op-check budget (memory.py)
    co_tenant_weights: int = 0
    ahead: int | None = None            # executors compiling queued candidates ahead (None: AHEAD of the device)
    compiled: bool | None = None        # timed steps under torch.compile (None: ``compiled_default`` of the device)


class ExecutorCandidate:
    """What the judge knows of the loaded candidate: its executor and what that executor reported at load
    (names, CONFIG, DESCRIPTION: descriptive only; nothing here decides a verdict)."""

    def __init__(self, name: str, executor: Executor, ops: list[str], config: dict, description: str,
                 source: str = ""):
        self.name, self.executor, self.ops, self.config, self.description = name, executor, ops, config, description
        self.source = source                    # the file it loaded: its compiled kernels are kept under it
        self.overrides = dict.fromkeys(ops)     # op names (the implementations live in the executor only)


class CandidateRaised(Exception):
    """An executor's error reply: the candidate raised (or ran out of memory, or broke its device)."""

    def __init__(self, text: str, kind: str):
        super().__init__(text)
        self.text, self.kind = text, kind
