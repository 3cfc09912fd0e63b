"""The weights on the GPU, shared by the judge with its executors: one copy per device, not one per process.

On CUDA the judge moves its model's weights into device allocations it makes itself with the driver
(``cuMemAlloc``: never the caching allocator's, so no other judge tensor, e.g. a reference output, shares
an allocation with them) and exports each with a legacy CUDA IPC handle; an executor maps them
(``cuIpcOpenMemHandle``; measured to work inside the full sandbox on the H200,
``benchmarks/sandbox_cuda.py``) and builds its model on those tensors. Before, every executor copied
the weights from the host arena to the device: a pool of warm executors of a GLM-5.2 slice did not fit
an H200 (a 6 GiB allocation failed with 2 GiB free).

A mapping is writable (legacy IPC has no read-only flag): the judge's ``TensorGuard`` fingerprints the
weights after every candidate with a key the executor never sees (``guards.fingerprint``), and a change
replaces the judge. The CPU path keeps the sealed host arena (``channel.Arena``), which no process can
write.

    layout = plan_buckets({name: (nbytes, ...)})      # pure: which tensors share an allocation, at what offset
    share = DeviceWeights.export(weights, device)     # judge: moves weights in place (same tensor objects)
    share.spec                                        # -> the executor's init message (msgpack-able)
    tensors = import_weights(spec, device)            # executor: name -> tensor on the shared memory

Cost: export copies the weights once on the device (bucket by bucket: at most one bucket, 256 MiB,
of extra memory at a time); import opens one handle per bucket (~0.1 ms each), no copy.
"""

from __future__ import annotations

import ctypes
import dataclasses
from dataclasses import dataclass

__all__ = ["BUCKET_BYTES", "ALIGN", "Slot", "plan_buckets", "DeviceWeights", "import_weights", "export_buffer",
           "free_buffer"]

BUCKET_BYTES = 256 << 20       # tensors packed into driver allocations of at most this (a bigger one: its own)
ALIGN = 256                    # byte alignment of every tensor inside its allocation


@dataclass(frozen=True)
class Slot:
    """Where one tensor lives: allocation ``bucket``, byte ``offset`` in it, ``nbytes``, dtype name, shape."""

    name: str
    bucket: int
    offset: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]


def plan_buckets(sizes: dict[str, tuple[int, str, tuple[int, ...]]],
                 bucket_bytes: int = BUCKET_BYTES) -> tuple[list[Slot], list[int]]:
    """Pack tensors (name -> (nbytes, dtype, shape), in order) into allocations: returns the slots and
    each allocation's size. A tensor never straddles two allocations; a zero-byte one takes no room."""
    slots: list[Slot] = []
    bucket_sizes: list[int] = []
    used = bucket_bytes                              # forces a first bucket
    for name, (nbytes, dtype, shape) in sizes.items():
        room = -(-nbytes // ALIGN) * ALIGN
        if not bucket_sizes or used + room > bucket_bytes:
            bucket_sizes.append(0)
            used = 0
        slots.append(Slot(name, len(bucket_sizes) - 1, used, nbytes, dtype, tuple(shape)))
        used += room
        bucket_sizes[-1] = max(bucket_sizes[-1], used, 1)
    return slots, bucket_sizes


class _CudaArray:
    """A non-owning ``__cuda_array_interface__`` of ``nbytes`` bytes at ``ptr`` (torch.as_tensor wraps it)."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3, "strides": None}


def _driver():
    cuda = ctypes.CDLL("libcuda.so.1")
    cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    cuda.cuMemFree_v2.argtypes = [ctypes.c_uint64]
    cuda.cuIpcGetMemHandle.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
    return cuda


def export_buffer(nbytes: int, device) -> tuple[int, dict, object]:
    """One exported driver allocation of ``nbytes`` (the judge's output ring of one executor): its pointer
    (for ``free_buffer``), the ``import_weights`` spec that maps it as one uint8 tensor named "buffer", and
    the judge's own uint8 view of it."""
    import torch

    torch.zeros(1, device=device)
    cuda = _driver()
    ptr = ctypes.c_uint64()
    _check(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(nbytes)), "cuMemAlloc")
    handle = (ctypes.c_ubyte * 64)()
    _check(cuda.cuIpcGetMemHandle(handle, ptr.value), "cuIpcGetMemHandle")
    slot = Slot("buffer", 0, 0, nbytes, "uint8", (nbytes,))
    _raw, views = _views([ptr.value], [nbytes], [slot], device)
    spec = {"handles": [bytes(handle).hex()], "bucket_sizes": [nbytes],
            "slots": [["buffer", 0, 0, nbytes, "uint8", [nbytes]]]}
    return ptr.value, spec, views["buffer"]


def free_buffer(ptr: int) -> None:
    """Give an ``export_buffer`` allocation back (after every process that mapped it has exited)."""
    _check(_driver().cuMemFree_v2(ctypes.c_uint64(ptr)), "cuMemFree")


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"{what} failed: CUDA driver error {rc}")


def _views(base_ptrs: list[int], bucket_sizes: list[int], slots: list[Slot], device):
    import torch

    raw = [torch.as_tensor(_CudaArray(p, n), device=device) for p, n in zip(base_ptrs, bucket_sizes)]
    out = {}
    for s in slots:
        flat = raw[s.bucket][s.offset:s.offset + s.nbytes]
        out[s.name] = flat.view(getattr(torch, s.dtype)).reshape(s.shape)
    return raw, out


class DeviceWeights:
    """The judge's side: weights in driver allocations, exported. Lives as long as the judge."""

    def __init__(self, slots: list[Slot], bucket_sizes: list[int], base_ptrs: list[int], handles: list[bytes],
                 raw: list):
        self.slots, self.bucket_sizes, self._ptrs, self._handles, self._raw = slots, bucket_sizes, base_ptrs, handles, raw

    @classmethod
    def export(cls, weights: dict, device) -> "DeviceWeights":
        """Move ``weights`` (name -> CUDA tensor) into exported allocations, in place: each tensor object
        is rebound (``set_``) to its new storage, so every holder of it (the model's layers) follows.
        Tensors that are the same storage and offset share one slot."""
        import torch

        torch.zeros(1, device=device)                 # the runtime's primary context, current on this thread
        first_of: dict[tuple, str] = {}
        alias_of: dict[str, str] = {}                 # a second name of a slot -> the slot's name
        unique = {}
        for name, t in weights.items():
            key = (t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride()))
            if key in first_of:
                alias_of[name] = first_of[key]
            else:
                first_of[key] = name
                unique[name] = t
        sizes = {n: (t.numel() * t.element_size(), str(t.dtype).removeprefix("torch."), tuple(t.shape))
                 for n, t in unique.items()}
        slots, bucket_sizes = plan_buckets(sizes)
        cuda = _driver()
        ptrs, handles, raws = [], [], []
        by_bucket: dict[int, list[Slot]] = {}
        for s in slots:
            by_bucket.setdefault(s.bucket, []).append(s)
        with torch.no_grad():
            for b, size in enumerate(bucket_sizes):
                ptr = ctypes.c_uint64()
                _check(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(size)), "cuMemAlloc")
                handle = (ctypes.c_ubyte * 64)()
                _check(cuda.cuIpcGetMemHandle(handle, ptr.value), "cuIpcGetMemHandle")
                raw, bucket_views = _views([ptr.value], [size],
                                           [dataclasses.replace(s, bucket=0) for s in by_bucket.get(b, [])], device)
                for name, view in bucket_views.items():
                    view.copy_(unique[name])
                    unique[name].set_(view.untyped_storage(), view.storage_offset(), view.shape, view.stride())
                torch.cuda.synchronize(device)
                torch.cuda.empty_cache()              # the old copies' blocks go back as each bucket lands
                ptrs.append(ptr.value)
                handles.append(bytes(handle))
                raws.extend(raw)
        with torch.no_grad():
            for name, first in alias_of.items():      # other tensor objects on a moved storage: follow it
                t, src = weights[name], unique[first]
                if t is not src:
                    t.set_(src.untyped_storage(), src.storage_offset(), src.shape, src.stride())
        return cls(slots, bucket_sizes, ptrs, handles, raws)

    @property
    def spec(self) -> dict:
        """What an executor needs to map the weights (msgpack-able; the handles are capabilities to this
        memory only, which the executor reads anyway)."""
        return {"handles": [h.hex() for h in self._handles], "bucket_sizes": list(self.bucket_sizes),
                "slots": [[s.name, s.bucket, s.offset, s.nbytes, s.dtype, list(s.shape)] for s in self.slots]}

    @property
    def nbytes(self) -> int:
        return sum(self.bucket_sizes)


def import_weights(spec: dict, device) -> dict:
    """The executor's side: map the judge's allocations, name -> tensor (writable memory: the judge
    fingerprints it after every candidate). Raises RuntimeError when a handle cannot be opened."""
    import torch

    torch.zeros(1, device=device)
    cuda = ctypes.CDLL("libcuda.so.1")
    open_handle = getattr(cuda, "cuIpcOpenMemHandle_v2", None) or cuda.cuIpcOpenMemHandle

    class IpcHandle(ctypes.Structure):                # CUipcMemHandle: 64 bytes, passed by value
        _fields_ = [("reserved", ctypes.c_ubyte * 64)]

    ptrs = []
    for hexed in spec["handles"]:
        ptr = ctypes.c_uint64()
        _check(open_handle(ctypes.byref(ptr), IpcHandle.from_buffer_copy(bytes.fromhex(hexed)), ctypes.c_uint(1)),
               "cuIpcOpenMemHandle")
        ptrs.append(ptr.value)
    slots = [Slot(n, b, o, nb, dt, tuple(sh)) for n, b, o, nb, dt, sh in spec["slots"]]
    _raw, tensors = _views(ptrs, spec["bucket_sizes"], slots, device)
    return tensors
