"""Does an executor still reach the GPU inside the sandbox? What each mechanism costs it.

    python benchmarks/sandbox_cuda.py --device cuda      # the H200 run (< 1 minute)
    python benchmarks/sandbox_cuda.py --device cpu       # the same logic on CPU (Triton interpreter)

For each sandbox configuration it spawns a sandboxed python (``persistent_engine.executor.sandbox``)
that imports torch and Triton, allocates a tensor on the device, runs a matmul and a Triton kernel
(JIT-compiled into the Triton cache inside the workdir: on CUDA the cache must fill there) and
checks both against torch; on CUDA it also opens a legacy CUDA IPC handle (``cuIpcOpenMemHandle``)
that this process (the judge's role) exported, to learn whether judge <-> executor tensors can be
shared without a copy under a PID namespace. Configurations:
  * ``full``: the default policy for the device (everything this kernel offers);
  * ``no_pid_namespace``: the same without the PID namespace (what legacy CUDA IPC may need);
  * ``address_space_64g``: the CPU policy's RLIMIT_AS of 64 GiB on the device (CUDA's VA reservations);
  * on failure of ``full``: ``full`` minus one mechanism at a time, to name the one that breaks it.
Prints a table; writes ``benchmarks/results/<device>-sandbox_cuda.json`` atomically.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from persistent_engine.executor import sandbox as sb  # noqa: E402

CHILD = r'''
import ctypes, json, os, sys, time
t0 = time.perf_counter()
out = {}
def done(**kw):
    out.update(kw)
    with open("result.json", "w") as f:
        json.dump(out, f)
    sys.exit(0)
try:
    import torch, triton, triton.language as tl
except Exception as e:
    done(error=f"import: {type(e).__name__}: {e}")
out["import_s"] = round(time.perf_counter() - t0, 3)
device = sys.argv[1]

@triton.jit
def axpy(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    # reads x[n], y[n]; writes out[n] = alpha * x + y
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, alpha * tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)

try:
    t1 = time.perf_counter()
    a = torch.randn(512, 512, device=device)
    out["matmul_ok"] = bool(torch.allclose((a @ a).cpu(), a.cpu() @ a.cpu(), rtol=1e-2, atol=1e-2))
    out["device_init_s"] = round(time.perf_counter() - t1, 3)
    t2 = time.perf_counter()
    x, y = torch.randn(10_000, device=device), torch.randn(10_000, device=device)
    z = torch.empty_like(x)
    axpy[(triton.cdiv(x.numel(), 1024),)](x, y, z, x.numel(), 2.0, BLOCK=1024)
    out["triton_ok"] = bool(torch.allclose(z, 2.0 * x + y))
    out["triton_s"] = round(time.perf_counter() - t2, 3)
    cache = os.environ.get("TRITON_CACHE_DIR", "")
    out["triton_cache_files"] = sum(len(f) for _, _, f in os.walk(cache)) if os.path.isdir(cache) else 0
except Exception as e:
    done(error=f"device: {type(e).__name__}: {e}")
if device.startswith("cuda") and os.path.exists("ipc.json"):
    spec = json.load(open("ipc.json"))
    cuda = ctypes.CDLL("libcuda.so.1")
    ptr = ctypes.c_uint64()
    class IpcHandle(ctypes.Structure):                 # CUipcMemHandle: 64 bytes, passed by value
        _fields_ = [("reserved", ctypes.c_ubyte * 64)]
    handle = IpcHandle.from_buffer_copy(bytes.fromhex(spec["handle"]))
    open_handle = getattr(cuda, "cuIpcOpenMemHandle_v2", None) or cuda.cuIpcOpenMemHandle
    rc = open_handle(ctypes.byref(ptr), handle, ctypes.c_uint(1))
    out["ipc_open_rc"] = rc
    if rc == 0:
        host = (ctypes.c_float * spec["n"])()
        out["ipc_copy_rc"] = cuda.cuMemcpyDtoH_v2(host, ptr, ctypes.c_size_t(4 * spec["n"]))
        out["ipc_ok"] = abs(sum(host) - spec["sum"]) < 1e-3 * max(1.0, abs(spec["sum"]))
        cuda.cuIpcCloseMemHandle(ptr)
done(total_s=round(time.perf_counter() - t0, 3))
'''


def export_ipc(device: str):
    """Allocate device memory in this process (the judge's role) with the driver (so the pointer is an
    allocation's base, as cuIpcGetMemHandle exports), fill it, and export a legacy CUDA IPC handle."""
    if not device.startswith("cuda"):
        return None, None
    import ctypes

    import torch
    torch.zeros(1, device=device)                      # the primary context, current on this thread
    cuda = ctypes.CDLL("libcuda.so.1")
    n = 4096
    host = (ctypes.c_float * n)(*[i / 7 for i in range(n)])
    ptr = ctypes.c_uint64()
    handle = (ctypes.c_ubyte * 64)()                   # cuIpcGetMemHandle writes it through a pointer
    for step, rc in (("alloc", lambda: cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(4 * n))),
                     ("copy", lambda: cuda.cuMemcpyHtoD_v2(ptr, host, ctypes.c_size_t(4 * n))),
                     ("export", lambda: cuda.cuIpcGetMemHandle(handle, ptr))):
        code = rc()
        if code != 0:
            return ptr, {f"{step}_rc": code}
    return ptr, {"handle": bytes(handle).hex(), "n": n, "sum": float(sum(host))}


def run_config(name: str, device: str, policy_kw: dict, ipc: dict | None, timeout_s: float) -> dict:
    workdir = sb.make_workdir()
    try:
        Path(workdir, "child.py").write_text(CHILD)
        if ipc and "handle" in ipc:
            Path(workdir, "ipc.json").write_text(json.dumps(ipc))
        policy = sb.SandboxPolicy.for_device(device, workdir, **policy_kw)
        t0 = time.perf_counter()
        with sb.spawn([sys.executable, os.path.join(workdir, "child.py"), device], policy,
                      stderr=open(os.path.join(workdir, "stderr"), "wb")) as proc:
            spawn_s = time.perf_counter() - t0
            try:
                rc = proc.wait(timeout_s)
            except Exception:  # noqa: BLE001 - a hang is a result too
                rc = "timeout"
            applied = proc.applied.as_dict()
            result = Path(proc.workdir_view, "result.json")        # on the workdir's tmpfs: the judge's view
            res = json.loads(result.read_text()) if result.exists() else {}
            proc.release_workdir()
        stderr_tail = Path(workdir, "stderr").read_text(errors="replace")[-600:]
        ok = rc == 0 and res.get("matmul_ok") and res.get("triton_ok") and "error" not in res
        return {"config": name, "ok": bool(ok), "rc": rc, "spawn_s": round(spawn_s, 3),
                "wall_s": round(time.perf_counter() - t0, 3), **res, "applied": applied,
                "disabled": list(policy.disable), "stderr_tail": "" if ok else stderr_tail}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--configs", default="full,no_pid_namespace,address_space_64g")
    ap.add_argument("--timeout", type=float, default=45.0, help="seconds per sandboxed run")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/<device>-sandbox_cuda.json)")
    args = ap.parse_args()
    caps = sb.probe()
    keep_alive, ipc = export_ipc(args.device)
    configs = {"full": {}, "no_pid_namespace": {"disable": ("pid_namespace",)},
               "address_space_64g": {"address_space_bytes": 64 * 2 ** 30}}
    results = [run_config(c, args.device, configs[c], ipc, args.timeout) for c in args.configs.split(",")]
    if not results[0]["ok"] and results[0]["config"] == "full":
        for mech in sb.MECHANISMS:                     # name the mechanism that breaks the device
            results.append(run_config(f"full-{mech}", args.device, {"disable": (mech,)}, ipc, args.timeout))
    print(f"sandbox on {args.device}: probe {'complete' if caps.complete() else 'INCOMPLETE ' + str(caps.missing())}")
    print(f"{'config':<22} {'ok':<5} {'rc':<8} {'spawn s':>8} {'import s':>9} {'device s':>9} {'triton s':>9} "
          f"{'cache':>6} {'ipc':>6}")
    for r in results:
        ipc_state = "-" if "ipc_open_rc" not in r else ("ok" if r.get("ipc_ok") else f"rc={r['ipc_open_rc']}")
        print(f"{r['config']:<22} {str(r['ok']):<5} {str(r['rc']):<8} {r['spawn_s']:>8.3f} "
              f"{r.get('import_s', float('nan')):>9.3f} {r.get('device_init_s', float('nan')):>9.3f} "
              f"{r.get('triton_s', float('nan')):>9.3f} {r.get('triton_cache_files', 0):>6} {ipc_state:>6}")
        if r.get("error") or r["stderr_tail"]:
            print(f"    {r.get('error', '')} {r['stderr_tail'][-300:]!r}")
    doc = {"benchmark": "sandbox_cuda", "device": args.device, "host": platform.node(),
           "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "probe": caps.as_dict(), "probe_errors": dict(caps.errors), "ipc_export": ipc and {
               k: v for k, v in ipc.items() if k != "handle"}, "results": results}
    out = Path(args.out or ROOT / "benchmarks" / "results" / f"{args.device.split(':')[0]}-sandbox_cuda.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=out.parent, delete=False, suffix=".tmp") as f:
        json.dump(doc, f, indent=1)
    os.replace(f.name, out)
    print(f"wrote {out}")
    del keep_alive
    return 0 if results[0]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
