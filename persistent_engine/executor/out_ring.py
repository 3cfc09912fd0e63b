"""The output ring: memory the judge owns, where an executor's timed runs must leave their outputs.

A timed ``run`` request asks for k chained steps of one point. Each step's output (its logits, [rows, V]) is
written into slot r of this ring, not into the executor's own memory: the judge fills the k slots with NaN
before it sends the request and, the moment the reply arrives, copies out what it will check (``observe``)
before it sends that executor anything else. So what the judge verifies is what the timed runs left when
they said they were done:
- work deferred past the reply leaves NaN (or a half-written slot) in the copy: the candidate is rejected;
- a run computed by another function "when observed" has nothing to be observed by: there is no fetch
  request any more, the copy is the judge's own;
- which run and which rows are compared with the reference is drawn after the reply (``observe``).
On CPU the executor's whole process tree is SIGSTOPped from the reply until the copy is taken (nothing of it
can write meanwhile). On CUDA the copy is stream-ordered work of the judge's own context, taken inside the
timed window with a synchronize before the clock stops: kernels the executor left queued either finish
before the copy (and their time counts) or leave NaN in it.

    ring = OutRing.create(nbytes, "cpu")          # judge: a sealed memfd (CPU) or an exported cuMemAlloc (CUDA)
    ring.fd, ring.spec                            # -> the executor (inherited fd / its init message)
    flat = open_ring(spec, fd, device)            # executor: a uint8 tensor over the same bytes
    runs = runs_view(flat, k, shape, dtype)       # both: [k, *shape] of dtype at the start of the ring
    ring.arm(k, shape, dtype)                     # judge: NaN in the k slots, on the device before the request
    seen = observe(ring, k, shape, dtype, rng)    # judge: run j's picked rows and every run's row 0, copied

Sizes: ``ring_bytes`` = the largest output times MAX_RUNS, capped at RING_BYTES (``ab.run_batch`` caps k to
fit): the baseline executor's, started before k is calibrated; ``ring_bytes_for`` = the largest calibrated
sample: every later executor's (a few MB for a 2-layer llama-1b tier instead of 256 MiB on the device).
Cost per timed request: one fill of k slots before it (outside the clock), one copy of k rows + 4 rows
after it (k x V x 2 bytes: 0.5 MB for llama-1b at k = 2).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import threading
from dataclasses import dataclass

import torch

RING_BYTES = {"cuda": 256 << 20, "cpu": 256 << 20}   # at most this per executor (k is capped to fit)
MAX_RUNS = 64                                         # the most runs one timed request asks for
SPOT_ROWS = 4                                         # rows of run j copied for the spot re-check
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
_PAGE = 4096


def ring_bytes(device_type: str, out_bytes: int) -> int:
    """The ring of an executor whose largest step output is ``out_bytes``."""
    want = max(1, MAX_RUNS * max(out_bytes, 1))
    return -(-min(want, RING_BYTES.get(device_type, RING_BYTES["cpu"])) // _PAGE) * _PAGE


def ring_bytes_for(ks: list[int], outs: list[torch.Tensor]) -> int:
    """The ring once k is calibrated per point: the largest sample (k runs of that point's output)."""
    need = max(k * o.numel() * o.element_size() for k, o in zip(ks, outs))
    return -(-max(need, 1) // _PAGE) * _PAGE


def runs_view(flat: torch.Tensor, k: int, shape, dtype: torch.dtype) -> torch.Tensor:
    """[k, *shape] of ``dtype`` over the start of ``flat`` (uint8); ValueError when k slots do not fit."""
    shape = tuple(int(x) for x in shape)
    numel = 1
    for x in shape:
        numel *= x
    nbytes = k * numel * torch.empty((), dtype=dtype).element_size()
    if k < 1 or nbytes > flat.numel():
        raise ValueError(f"{k} runs of {list(shape)} {dtype} need {nbytes} bytes; the output ring has {flat.numel()}")
    return flat[:nbytes].view(dtype).view(k, *shape)


class OutRing:
    """The judge's side: one executor's ring, created before the executor starts and closed after it exited."""

    def __init__(self, flat: torch.Tensor, device: torch.device, fd: int | None, spec: dict, ptr: int | None,
                 mapping: mmap.mmap | None):
        self.flat, self.device, self.fd, self.spec = flat, device, fd, spec
        self.nbytes = flat.numel()
        self._ptr, self._map = ptr, mapping
        self._closing = threading.Lock()

    @classmethod
    def create(cls, nbytes: int, device) -> "OutRing":
        """CPU: a memfd sealed against shrinking and growing (the judge's reads can never fault), mapped here;
        CUDA: a driver allocation of its own (``device_share.export_buffer``), exported to the executor."""
        device = torch.device(device)
        if device.type == "cuda":
            from persistent_engine.executor.device_share import export_buffer

            ptr, spec, flat = export_buffer(nbytes, device)
            return cls(flat, device, None, {**spec, "nbytes": nbytes}, ptr, None)
        fd = os.memfd_create("tkcc-out-ring", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, nbytes)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
        mapping = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        flat = torch.frombuffer(mapping, dtype=torch.uint8, count=nbytes)
        return cls(flat, device, fd, {"nbytes": nbytes}, None, mapping)

    def sealed(self) -> bool:
        return self.fd is None or fcntl.fcntl(self.fd, fcntl.F_GET_SEALS) & _SEALS == _SEALS

    def runs(self, k: int, shape, dtype: torch.dtype) -> torch.Tensor:
        return runs_view(self.flat, k, shape, dtype)

    def arm(self, k: int, shape, dtype: torch.dtype) -> None:
        """NaN in slots 0..k-1 (integer outputs: the dtype's minimum), landed before the request is sent."""
        runs = self.runs(k, shape, dtype)
        runs.fill_(float("nan") if dtype.is_floating_point else torch.iinfo(dtype).min)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def close(self) -> None:
        """Idempotent; call after the executor exited (CUDA: the allocation is freed)."""
        with self._closing:
            ptr, mapping, fd = self._ptr, self._map, self.fd
            self._ptr, self._map, self.fd = None, None, None
        self.flat = torch.empty(0, dtype=torch.uint8)
        if ptr is not None:
            from persistent_engine.executor.device_share import free_buffer

            try:
                torch.cuda.synchronize(self.device)
                free_buffer(ptr)
            except RuntimeError:                 # a device error: the context (and the allocation) are gone
                pass
        if mapping is not None:
            try:
                mapping.close()
            except BufferError:                  # a view still alive: the mapping goes with it
                pass
        if fd is not None:
            os.close(fd)


@dataclass(frozen=True)
class Observed:
    """What the judge copied out of the ring right after a run request's reply: run ``j`` (drawn then),
    its rows ``rows`` (drawn then) as ``out``; row 0 of every run as ``row0`` ([k, V]: the chain's links)."""

    j: int
    rows: list[int]
    out: torch.Tensor
    row0: torch.Tensor

    def unwritten(self) -> str | None:
        """Why the copy shows runs that were not done when the executor replied (None: all written)."""
        bad = [r for r in range(self.row0.shape[0]) if bool(_unset(self.row0[r]).any())]
        if bool(_unset(self.out).any()) and self.j not in bad:
            bad.append(self.j)
        if not bad:
            return None
        return (f"timed run(s) {sorted(bad)[:8]} of {self.row0.shape[0]} had not written their output when the "
                "executor replied (work deferred past the reply, or no output at all)")


def _unset(t: torch.Tensor) -> torch.Tensor:
    return t.isnan() if t.dtype.is_floating_point else t == torch.iinfo(t.dtype).min


def observe(ring: OutRing, k: int, shape, dtype: torch.dtype, rng) -> Observed:
    """The judge's copy of a finished request's outputs: run j and SPOT_ROWS of its rows drawn now from the
    judge's ``rng``; on CUDA synchronised (the caller stops its clock after this)."""
    runs = ring.runs(k, shape, dtype)
    j = rng.randrange(k)
    n = runs.shape[1] if runs.dim() > 1 else 1
    rows = sorted(rng.sample(range(n), min(n, SPOT_ROWS)))
    out = runs[j][rows].clone() if runs.dim() > 1 else runs[j].clone()
    row0 = runs[:, 0].clone() if runs.dim() > 1 else runs.clone()
    if ring.device.type == "cuda":
        torch.cuda.synchronize(ring.device)
    return Observed(j, rows, out, row0)


def open_ring(spec: dict, fd: int | None, device) -> torch.Tensor:
    """The executor's side: the ring as a uint8 tensor (CPU: the inherited memfd mapped; CUDA: the judge's
    allocation opened by its IPC handle)."""
    device = torch.device(device)
    if device.type == "cuda":
        from persistent_engine.executor.device_share import import_weights

        return import_weights(spec, device)["buffer"]
    nbytes = int(spec["nbytes"])
    mapping = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    return torch.frombuffer(mapping, dtype=torch.uint8, count=nbytes)
