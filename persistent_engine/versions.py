"""Software versions recorded with every measurement: Python, torch, Triton, CUDA and the NVIDIA
driver. Stdlib only at import; torch and triton are looked up when asked (never imported here)."""

from __future__ import annotations

import importlib.metadata as md
import platform
import shutil
import subprocess


def package_version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def driver_version() -> str | None:
    """The NVIDIA driver as ``nvidia-smi`` reports it; None where there is none."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        r = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else None


def software_versions(driver: bool = True) -> dict:
    """{"python", "torch", "triton", "cuda", "driver"}; None for what is absent. ``driver=False``
    skips the nvidia-smi call (where no GPU is used)."""
    cuda = None
    try:
        import torch
        cuda = torch.version.cuda
    except ImportError:
        pass
    return {"python": platform.python_version(), "torch": package_version("torch"),
            "triton": package_version("triton"), "cuda": cuda,
            "driver": driver_version() if driver else None}


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def device_name(device: str) -> str:
    """What a measurement on ``device`` ("cpu", "cuda") ran on: the GPU's name, or the CPU's model."""
    if device.startswith("cuda"):
        import torch
        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    return cpu_model()
