"""``tkcc doctor [--json]``: what this machine offers tkcc, on one screen.

Detected devices (name, memory, compute capability), Python / torch / Triton / CUDA / driver
versions, and which optional parts are present: Ray (many machines), the PostgreSQL driver (a shared
board), the LLM SDKs and whether their API keys are set (the values are never printed), and which
mechanisms of the executor sandbox this kernel offers (LLM-written candidates are refused without a
complete one unless ``--unsafe-no-sandbox``).
Exit 0; the report is informational.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import sys

# (label, import name, distribution, what it enables)
OPTIONAL = [
    ("ray", "ray", "ray", "Ray fleet (many machines)"),
    ("psycopg", "psycopg", "psycopg", "PostgreSQL board"),
    ("anthropic", "anthropic", "anthropic", "Anthropic LLM agents"),
    ("openai", "openai", "openai", "OpenAI / compatible LLM agents"),
]
REQUIRED = ["torch", "triton", "pyzmq", "msgpack", "sqlalchemy", "pandas", "pyarrow", "fastapi"]   # distributions
API_KEYS = ["ANTHROPIC_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL"]


def register(subparsers) -> None:
    p = subparsers.add_parser("doctor", help="show devices, versions and optional parts")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(func=run)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _present(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _devices() -> tuple[dict, list[dict]]:
    info: dict = {"torch": None, "cuda": None, "hip": None, "triton": _version("triton"), "driver": None}
    devices = [{"name": "cpu", "kind": "cpu", "cores": os.cpu_count()}]
    try:
        import torch
    except ImportError:
        return info, devices
    info["torch"] = torch.__version__
    info["cuda"] = torch.version.cuda
    info["hip"] = getattr(torch.version, "hip", None)
    if torch.cuda.is_available():
        from persistent_engine.versions import driver_version
        info["driver"] = driver_version()
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            devices.append({"name": p.name, "kind": "cuda", "index": i, "memory_gib": round(p.total_memory / 2 ** 30, 1),
                            "capability": f"{p.major}.{p.minor}", "multiprocessors": p.multi_processor_count})
    return info, devices


def collect() -> dict:
    versions, devices = _devices()
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": versions,
        "devices": devices,
        "required": {dist: _version(dist) for dist in REQUIRED},
        "optional": {label: {"present": _present(mod), "version": _version(dist), "enables": what}
                     for label, mod, dist, what in OPTIONAL},
        "api_keys": {k: bool(os.environ.get(k)) for k in API_KEYS},
        "sandbox": _sandbox(),
    }


def _sandbox() -> dict:
    from persistent_engine.executor.sandbox import probe
    caps = probe()
    return {"mechanisms": caps.as_dict(), "missing": list(caps.missing()), "complete": caps.complete(),
            "errors": dict(caps.errors)}


def render(r: dict) -> str:
    v = r["versions"]
    lines = [f"tkcc doctor: Python {r['python']} on {r['platform']}",
             f"  torch {v['torch'] or 'MISSING'}  triton {v['triton'] or 'MISSING'}  CUDA {v['cuda'] or '-'}"
             + (f"  ROCm {v['hip']}" if v.get("hip") else "") + f"  driver {v['driver'] or '-'}",
             "devices:"]
    for d in r["devices"]:
        if d["kind"] == "cpu":
            lines.append(f"  cpu            {d['cores']} cores")
        else:
            lines.append(f"  cuda:{d['index']:<9} {d['name']}, {d['memory_gib']} GiB, sm {d['capability']}, "
                         f"{d['multiprocessors']} SMs")
    missing = [k for k, ver in r["required"].items() if ver is None]
    lines.append("required parts: " + ("all present" if not missing else "MISSING " + ", ".join(missing)))
    lines.append("optional parts:")
    for label, o in r["optional"].items():
        state = f"present {o['version'] or ''}".strip() if o["present"] else "absent"
        lines.append(f"  {label:<10} {state:<18} {o['enables']}")
    sb = r["sandbox"]
    on = [k for k, v in sb["mechanisms"].items() if v is True and k != "complete"]
    lines.append(f"executor sandbox: {'complete' if sb['complete'] else 'INCOMPLETE'}"
                 f" (Landlock ABI {sb['mechanisms']['landlock_abi']}): " + ", ".join(on))
    off = [k for k, v in sb["mechanisms"].items() if v is False]
    if off:
        lines.append("  absent: " + ", ".join(off))
    if not sb["complete"]:
        lines.append("  missing: " + "; ".join(sb["missing"])
                     + " -- LLM-written candidates are refused unless --unsafe-no-sandbox")
    for what, why in sb["errors"].items():
        lines.append(f"  {what}: {why}")
    lines.append("API keys: " + ", ".join(f"{k} {'set' if on else 'not set'}" for k, on in r["api_keys"].items()))
    return "\n".join(lines)


def run(args) -> int:
    report = collect()
    print(json.dumps(report) if args.json else render(report))
    sys.stdout.flush()
    return 0
