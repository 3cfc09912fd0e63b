"""Device facts and warm-up that both the judge and its executors need (torch, triton only).

- ``free_gpu_bytes(device)``: free memory on a CUDA device now (every process counted), 0 elsewhere.
- ``gpu_bytes(device)``: the GPU's total memory; None on CPU.
- ``warm_triton(device)``: compiles and launches one trivial Triton kernel (~2 s the first time in a
  process on a GPU), so that the first candidate's timing does not pay for Triton's start-up.
"""

from __future__ import annotations

import torch


def free_gpu_bytes(device) -> int:
    """Free memory on a CUDA device (every process counted), 0 elsewhere."""
    return torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 0


def gpu_bytes(device: torch.device) -> int | None:
    """Total memory of the engine's GPU; None on CPU (where the tiny and one-layer models stay small)."""
    return torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None


def warm_triton(device: torch.device) -> None:
    """Compile and launch one trivial Triton kernel (~2 s on a GPU the first time in a process)."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return

    @triton.jit
    def _copy(src, dst, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)

    try:
        x = torch.arange(16, dtype=torch.float32, device=device)
        y = torch.empty_like(x)
        _copy[(1,)](x, y, 16, BLOCK=16)
    except Exception:  # noqa: BLE001 - no Triton backend here (CPU without the interpreter)
        pass
