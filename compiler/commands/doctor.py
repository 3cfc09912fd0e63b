"""``tkcc doctor [--json]``: what this machine offers tkcc, on one screen.

Detected devices (name, memory, compute capability), Python / torch / Triton / CUDA / driver
versions, and which optional parts are present: Ray (many machines), the PostgreSQL driver (a shared
board); the LLM SDKs (installed or not, their versions) and whether their API keys and endpoints are set
(the values are never printed), and any engine process that outlived the orchestrator that started it
(``stray_engines``: pid, command line); and which
mechanisms of the executor sandbox hold on this machine, under the CPU executors' policy and under the CUDA
one (uid, tmpfs workdir, hidden dirs and host sockets, memory cgroup, namespaces, Landlock, seccomp, rlimits;
LLM-written candidates are refused without a complete one unless ``--unsafe-no-sandbox``).
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
]
REQUIRED = ["torch", "triton", "pyzmq", "msgpack", "sqlalchemy", "pandas", "pyarrow", "fastapi"]   # distributions
# (SDK import name = distribution, key variable, endpoint variable, what it enables)
LLM_SDKS = [("anthropic", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "--agents anthropic:N"),
            ("openai", "OPENAI_API_KEY", "OPENAI_BASE_URL", "--agents openai:N (or any compatible server)")]
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
        from persistent_engine import driver_version
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
        "llm_sdks": {sdk: {"installed": _present(sdk), "version": _version(sdk) if _present(sdk) else None, "key": key,
                           "key_set": bool(os.environ.get(key)), "base_url_set": bool(os.environ.get(url)),
                           "enables": what}
                     for sdk, key, url, what in LLM_SDKS},
        "api_keys": {k: bool(os.environ.get(k)) for k in API_KEYS},
        "stray_engines": _strays(),
        "models": _models(),
        "sandbox": _sandbox(),
    }


def _strays() -> list[dict]:
    """Engine processes that outlived their orchestrator (persistent_engine.lifeline)."""
    from persistent_engine import stray_processes
    return stray_processes()


def _models() -> dict[str, str]:
    """alias -> the release it names (any with ``--tiny``, or a config.json path, also works)."""
    from persistent_engine.models.spec import ALIASES, RELEASES

    return {a: RELEASES.get(a, a) for a in ALIASES}


def _sandbox() -> dict:
    """The CPU policy's mechanisms (top level) and the CUDA policy's (``cuda``: probed without a GPU; its
    files, uid, sockets and memory cgroup are what a GPU executor gets)."""
    from persistent_engine import sandbox_probe as probe

    def one(device: str) -> dict:
        caps = probe(device)
        return {"mechanisms": caps.as_dict(), "missing": list(caps.missing()), "complete": caps.complete(),
                "errors": dict(caps.errors)}
    return {**one("cpu"), "cuda": one("cuda")}


def _render_sandbox(sb: dict) -> list[str]:
    """What holds under both policies on one line, then what does not, per policy, and why."""
    pols = {"cpu": sb, "cuda": sb["cuda"]}
    state = ", ".join(f"{'complete' if p['complete'] else 'INCOMPLETE'} on {n}" for n, p in pols.items())
    lines = [f"executor sandbox: {state} (Landlock ABI {sb['mechanisms']['landlock_abi']})"]
    names = [k for k, v in sb["mechanisms"].items() if isinstance(v, bool) and k != "complete"]
    lines.append("  holds on cpu and cuda: " + ", ".join(k for k in names if all(p["mechanisms"].get(k) is True
                                                                               for p in pols.values())))
    for n, p in pols.items():
        off = [k for k in names if p["mechanisms"].get(k) is not True]
        if off:
            lines.append(f"  not on {n}: " + ", ".join(off))
    for n, p in pols.items():
        if not p["complete"]:
            lines.append(f"  missing on {n}: " + "; ".join(p["missing"])
                         + " -- LLM-written candidates are refused unless --unsafe-no-sandbox")
        lines += [f"  {n} {what}: {why}" for what, why in p["errors"].items()]
    return lines


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
    lines.append("LLM SDKs:")
    for sdk, o in r["llm_sdks"].items():
        state = f"installed {o['version'] or ''}".strip() if o["installed"] else "NOT INSTALLED"
        where = "custom endpoint" if o["base_url_set"] else "default endpoint"
        lines.append(f"  {sdk:<10} {state:<18} {o['key']} {'set' if o['key_set'] else 'not set'}, {where}; "
                     f"{o['enables']}")
    lines += _render_sandbox(r["sandbox"])
    lines.append("API keys: " + ", ".join(f"{k} {'set' if on else 'not set'}" for k, on in r["api_keys"].items()))
    strays = r.get("stray_engines") or []
    lines.append("stray engines: " + ("none" if not strays else f"{len(strays)} outlived their orchestrator "
                                      "(kill them by pid)"))
    lines += [f"  pid {s['pid']} (started by {s['parent_pid'] or '?'}, now a child of {s['ppid']}): "
              f"{s['cmdline'][:120]}" for s in strays]
    lines.append("models (--model; any with --tiny at toy size; or a config.json): "
                 + ", ".join(f"{a} ({rel})" for a, rel in r["models"].items()))
    return "\n".join(lines)


def run(args) -> int:
    report = collect()
    print(json.dumps(report) if args.json else render(report))
    sys.stdout.flush()
    return 0
