"""The OS sandbox every executor runs in (Linux), and the one environment builder candidates see.

Public face (stable names; the judge and the serving path build on them)::

    policy = SandboxPolicy.for_device("cuda", make_workdir())
    proc = spawn([sys.executable, "-m", "persistent_engine.executor", ...], policy, pass_fds=(sock,))
    proc.applied        # SandboxCapabilities actually in force for this process (attach .as_dict() to verdicts)
    proc.send_signal(signal.SIGSTOP)   # every process of the tree, daemons included (A/B timing)
    proc.signal_group(signal.SIGSTOP)  # the same in one syscall where the tree is sealed in its group
    proc.kill_all()     # SIGKILL the whole tree, double-forked / setsid descendants included; reap
    probe("cuda")       # what this machine offers under that device's policy (cached); `tkcc doctor` prints it
    proc.workdir_view   # the judge's path to the executor's tmpfs workdir; proc.memory_cgroup: its memory cgroup
    require_sandbox(author_is_llm=True, unsafe=False)   # refuses LLM code when the sandbox is incomplete

How (``confine.py`` is the launcher process, stdlib only, started as ``python -I -S confine.py``):
- **tree**: the launcher is a child subreaper in fresh user + PID namespaces; the executor is PID 1 of
  its namespace, so when it dies the kernel kills every process it left; without a PID namespace the
  subreaper adopts orphans and ``kill_all`` walks ``/proc`` from the launcher. The executor makes its
  own process group before confining and seccomp denies setsid/setpgid, so the whole tree (every
  descendant, however it double-forks) stays in that group: ``signal_group`` stops, continues or kills
  it with one killpg(2), atomic against a concurrent fork (a fork racing a group signal is restarted,
  so a child is never left running behind a stopped parent); with a cgroup v2 directory of its own
  (``proc.cgroup``) ``cgroup.freeze`` / ``cgroup.kill`` instead; without seccomp, ``/proc`` scans only.
  A lifeline pipe (the judge holds the write end) kills the tree when the judge dies, whichever thread
  spawned it. As PID 1
  the executor's own signals without a handler are dropped by the kernel (an abort it raises on itself
  does not end it): a program that must die by them forks and serves from the child.
- **network**: a fresh network namespace (an unconfigured loopback only); Landlock denies TCP
  bind/connect (ABI >= 4); seccomp refuses socket(2) of every family (``AF_UNIX`` too: a pathname socket of a
  local service, e.g. PostgreSQL's, is reachable from any network namespace; on CUDA ``AF_UNIX``
  stays, the driver needs it, and the hidden socket dirs keep host sockets out of reach but for
  ``CUDA_REVEAL``: the persistence daemon's and MPS's); socketpair(2) stays.
- **host files**: the executor runs as ``run_as`` (65534 inside and outside the user namespace, no
  groups) when the launcher is root on the host, so root-owned 0600 files and ``/root`` (0700) stay
  closed; its workdir is a fresh tmpfs of ``workdir_bytes`` (``for_device``: 1 GiB; the judge's files
  copied in), the only writable place, seen by the judge through ``workdir_view`` (an fd it holds, so
  the files outlive the tree until ``release_workdir``); ``/tmp``, ``/var/tmp``, ``/run`` and the
  workdir's parent are empty tmpfs, so no other executor's workdir, no earlier candidate's source and
  no host pathname socket is visible; what it must read to run (the interpreter, this package,
  PYTHONPATH: ``keep``) is bound back, an ancestor its uid cannot search (``/root`` holding a pyenv
  Python) hidden the same way. ``tkcc doctor`` says what held, per policy.
- **writes**: in the mount namespace every mount is read-only but ``workdir`` (+ ``writable``), a
  private ``/dev/shm`` tmpfs and ``/proc`` (EROFS for writes, chmod, utime, xattrs); Landlock grants
  write rights only beneath the same dirs, on the GPU device nodes and on the executor's own
  ``/proc/self/task`` (thread names: the CUDA driver fails at init when it cannot set them); it does
  not cover chmod/utime/xattrs.
- **secrets**: the environment comes only from ``executor_env`` (an allow-list, never a key or the
  judge's token); a private ``/proc`` shows no outside process, and a Landlock domain cannot ptrace
  or read ``/proc/PID/environ`` of processes outside it, nor signal them (ABI >= 6).
- **limits**: rlimits (address space, processes, file size, CPU seconds, open files, no core files);
  a memory cgroup per tree (``memory_bytes``; ``cgroup_memory``: v2 where delegated, else the v1
  memory hierarchy), the only memory limit on CUDA; ``SandboxedProcess.memory_cgroup`` names it (the
  launcher is in it too: it is not the freeze cgroup ``proc.cgroup``).
- **privileges**: no-new-privs, an empty capability bounding set, seccomp denies ptrace,
  process_vm_*, mount/unshare/setns, io_uring, bpf, keyrings, kexec and modules.

Judge <-> executor traffic goes over inherited fds (``pass_fds``: socketpairs, pipes, memfds), since
the executor has no network. Size memfds in the judge: RLIMIT_FSIZE also caps ``ftruncate``.

CUDA: ``address_space_bytes`` must stay ``None`` for a GPU executor (the driver reserves VA ranges
larger than the device memory at init and fails under RLIMIT_AS); the GPU nodes ``/dev/nvidia*``,
``/dev/dri/*``, ``/dev/kfd`` are writable. Legacy CUDA IPC (``cuIpcOpenMemHandle``) may not open
across PID namespaces (``benchmarks/sandbox_cuda.py`` measures it): ``pid_namespace=False`` then; the
subreaper keeps the tree kill. ``disable=`` drops any mechanism (``MECHANISMS``) a driver breaks.

``executor_env(policy, extra)`` refuses an ``extra`` whose name looks like a secret or ``TKCC_*``:
what the judge must tell the executor goes in argv or over the channel, identical when serving.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import re
import resource
import select
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields

from persistent_engine import scratch
from persistent_engine.executor import cgroup_memory
from persistent_engine.executor.confine_fs import HIDE, chown_tree
from persistent_engine.executor.sandboxed_process import SandboxedProcess

__all__ = ["SandboxPolicy", "SandboxCapabilities", "SandboxedProcess", "SandboxError", "UnsafeSandbox",
           "probe", "executor_env", "make_workdir", "spawn", "require_sandbox", "CLASSES", "MECHANISMS"]

LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "confine.py")
WORKDIR_PREFIX = "tkcc-exec-"
GIB = 2 ** 30

# Copied from the parent environment when set (never one that matches SECRET_NAME). The math libraries'
# numerics switches (cuBLAS workspace, TF32 override) travel too: without them an executor's reference GEMMs
# may pick other algorithms than the judge's and round differently, and the judge's MoE routing (recorded
# in its own process) then differs from a candidate run's upstream of anything the candidate overrides.
ENV_ALLOW = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "PYTHONPATH", "VIRTUAL_ENV", "LD_LIBRARY_PATH",
             "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "CUDA_HOME",
             "CUDA_PATH", "CUDA_MODULE_LOADING", "CUDA_DEVICE_ORDER", "HIP_VISIBLE_DEVICES",
             "ROCR_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
             "CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_*", "NVIDIA_TF32_OVERRIDE",
             "TRITON_*", "TORCH_*", "PYTORCH_*")
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION|^TKCC_|_URL$|^AWS_|^GOOGLE_|^HF_",
                         re.IGNORECASE)
# Set by executor_env itself: caches and temp files go to the workdir.
ENV_WORKDIR = {"HOME": "", "TMPDIR": "tmp", "XDG_CACHE_HOME": "cache", "TRITON_CACHE_DIR": "triton",
               "TORCHINDUCTOR_CACHE_DIR": "inductor", "CUDA_CACHE_PATH": "nv"}
DEVICE_GLOBS = ("/dev/nvidia*", "/dev/nvidia-caps/*", "/dev/dri/*", "/dev/kfd")
STD_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
NOBODY = 65534
# bound back under the hidden /run and /tmp for a CUDA executor: the persistence daemon's socket, the MPS pipes
CUDA_REVEAL = ("/run/nvidia-persistenced", "/var/run/nvidia-persistenced", "/tmp/nvidia-mps")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# confinement class -> the mechanisms any one of which covers it
CLASSES: dict[str, tuple[str, ...]] = {
    "network": ("net_namespace", "seccomp"),
    "unix_sockets": ("seccomp_unix", "socket_dirs_hidden"),   # pathname sockets of local services (a database)
    "host_files": ("unprivileged_uid",),        # root-owned 0600 files, /root: not the executor's to read
    "other_workdirs": ("hidden_dirs",),         # other executors' workdirs, earlier candidates' sources
    "writes": ("readonly_root", "landlock_fs"),   # Landlock alone leaves chmod/utime/xattrs of one's own files
    "secrets": ("private_proc", "landlock_fs"),
    "tree": ("pid_namespace", "subreaper"),
    "limits": ("rlimits",),
    "privileges": ("no_new_privs",),
}


# what SandboxPolicy.disable may name
MECHANISMS = ("user_namespace", "net_namespace", "pid_namespace", "mount_namespace", "landlock", "seccomp", "rlimits",
              "unprivileged_uid", "workdir_tmpfs", "hidden_dirs", "memory_cgroup")


class SandboxError(RuntimeError):
    """The sandboxed process could not be started (bad argv, the launcher died before confining)."""


class UnsafeSandbox(RuntimeError):
    """An LLM-written candidate was refused: the sandbox is incomplete and --unsafe-no-sandbox was not given."""

    user_error = True


@dataclass(frozen=True)
class SandboxPolicy:
    """What one executor may do. ``workdir`` is its private temp dir: the only writable place (plus
    ``writable`` and the GPU device nodes). A limit of ``None`` leaves the parent's."""

    workdir: str
    allow_network: bool = False
    allow_unix_sockets: bool = False            # socket(AF_UNIX): CUDA MPS clients need it
    pid_namespace: bool = True                  # False for legacy CUDA IPC with the judge (see module doc)
    address_space_bytes: int | None = None      # RLIMIT_AS; None on CUDA (the driver's VA reservations)
    max_processes: int | None = 1024            # RLIMIT_NPROC (threads count), per user namespace; not for uid 0
    max_file_bytes: int | None = 8 * GIB        # RLIMIT_FSIZE
    cpu_seconds: int | None = 3600              # RLIMIT_CPU over the executor's life (SIGXCPU, then SIGKILL)
    open_files: int | None = 4096               # RLIMIT_NOFILE
    writable: tuple[str, ...] = ()              # more writable dirs (e.g. a Triton cache the judge seeds)
    run_as: int | None = NOBODY                 # the uid/gid inside and outside the user namespace (not 0)
    workdir_bytes: int | None = None            # the workdir on a private tmpfs of this size (None: the host dir)
    hide: tuple[str, ...] = HIDE                # covered by empty tmpfs (the workdir's parent too)
    reveal: tuple[str, ...] = ()                # dirs under ``hide`` bound back (what the CUDA driver may need)
    memory_bytes: int | None = None             # the tree's memory cgroup limit, where one can be made
    device_globs: tuple[str, ...] = DEVICE_GLOBS
    env_allow: tuple[str, ...] = ENV_ALLOW      # names, or prefixes ending in "*"
    disable: tuple[str, ...] = ()               # mechanisms not to use (MECHANISMS): fallback tests, a driver they break

    def __post_init__(self):
        unknown = set(self.disable) - set(MECHANISMS)
        if unknown:
            raise ValueError(f"SandboxPolicy.disable: unknown mechanisms {sorted(unknown)}; known: {MECHANISMS}")
        if self.run_as == 0:
            raise ValueError("SandboxPolicy.run_as: 0 is the host's root; use None to keep the launcher's uid")

    @classmethod
    def for_device(cls, device: str, workdir: str, **overrides) -> "SandboxPolicy":
        """The default for a ``cpu`` or ``cuda[:N]`` executor: a 1 GiB tmpfs workdir, a 64 GiB memory cgroup
        (where one can be made), a 64 GiB address-space cap on CPU only; on CUDA ``socket(AF_UNIX)`` stays
        allowed (the driver's init creates one and fails with error 304 when it is refused; measured on the
        H200, ``benchmarks/results/h200-sandbox-mechanisms.log``), the host's socket dirs stay hidden but
        for ``CUDA_REVEAL``."""
        gpu = device.startswith("cuda")
        base = {"address_space_bytes": None if gpu else 64 * GIB, "allow_unix_sockets": gpu,
                "workdir_bytes": GIB, "memory_bytes": 64 * GIB, "reveal": CUDA_REVEAL if gpu else ()}
        return cls(workdir=workdir, **{**base, **overrides})

    def rlimits(self) -> dict[str, list[int]]:
        want = {"RLIMIT_AS": self.address_space_bytes, "RLIMIT_NPROC": self.max_processes,
                "RLIMIT_FSIZE": self.max_file_bytes, "RLIMIT_NOFILE": self.open_files}
        out = {"RLIMIT_CORE": [0, 0]}
        for name, value in want.items():
            if value is not None:
                hard = resource.getrlimit(getattr(resource, name))[1]
                value = value if hard == resource.RLIM_INFINITY else min(value, hard)
                out[name] = [value, value]
        if self.cpu_seconds is not None:
            out["RLIMIT_CPU"] = [self.cpu_seconds, self.cpu_seconds + 5]
        return out

    def device_files(self) -> list[str]:
        return list(STD_DEVICES) + sorted({p for g in self.device_globs for p in glob.glob(g)
                                           if not os.path.isdir(p)})


@dataclass(frozen=True)
class SandboxCapabilities:
    """Which mechanisms are in force (``probe()``: which this kernel offers). One bool per mechanism."""

    user_namespace: bool = False
    net_namespace: bool = False
    pid_namespace: bool = False
    mount_namespace: bool = False
    private_proc: bool = False
    private_shm: bool = False
    readonly_root: bool = False
    landlock_fs: bool = False
    landlock_net: bool = False
    landlock_scope: bool = False
    seccomp: bool = False
    seccomp_unix: bool = False                  # seccomp refuses socket(AF_UNIX) too (not on CUDA)
    unprivileged_uid: bool = False              # the executor's uid on the host is not 0
    workdir_tmpfs: bool = False
    hidden_dirs: bool = False                   # the workdir's parent (other executors' dirs) hidden
    socket_dirs_hidden: bool = False            # /tmp, /var/tmp, /run hidden (host pathname sockets)
    memory_cgroup: bool = False
    rlimits: bool = False
    no_new_privs: bool = False
    caps_dropped: bool = False
    subreaper: bool = False
    landlock_abi: int = 0
    errors: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    @classmethod
    def from_status(cls, applied: Mapping, errors: Mapping[str, str] | None = None) -> "SandboxCapabilities":
        names = {f.name for f in fields(cls)} - {"errors"}
        return cls(**{k: v for k, v in applied.items() if k in names},
                   errors=tuple(sorted((errors or {}).items())))

    def classes(self) -> dict[str, bool]:
        """Per confinement class (``CLASSES``): is at least one of its mechanisms in force."""
        return {name: any(getattr(self, m) for m in mechs) for name, mechs in CLASSES.items()}

    def missing(self) -> tuple[str, ...]:
        """The confinement classes no mechanism covers, each with what would cover it."""
        return tuple(f"{name} (needs {' or '.join(CLASSES[name])})"
                     for name, ok in self.classes().items() if not ok)

    def complete(self) -> bool:
        return not self.missing()

    def as_dict(self) -> dict[str, bool | int]:
        """Flat, for a verdict's metadata: every mechanism, ``landlock_abi`` and ``complete``."""
        out: dict[str, bool | int] = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "errors"}
        out["complete"] = self.complete()
        return out


# ------------------------------------------------------------------------------------ environment
def make_workdir(parent: str | None = None) -> str:
    """A fresh private directory (mode 0700) named the same way for the harness and for serving."""
    return tempfile.mkdtemp(prefix=WORKDIR_PREFIX, dir=parent)


def _allowed(name: str, allow: Sequence[str]) -> bool:
    return any(name == a or (a.endswith("*") and name.startswith(a[:-1])) for a in allow)


def executor_env(policy: SandboxPolicy, extra: Mapping[str, str] | None = None,
                 base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ONE environment a candidate ever sees, in the judge's executors and on the serving path
    alike (harness-blind): the allow-listed variables of ``base`` (default ``os.environ``) that do not
    look like secrets, HOME/TMPDIR/caches inside the workdir, then ``extra``. ``extra`` naming a
    secret-looking variable is refused (ValueError): the judge's token never travels by environment."""
    base = os.environ if base is None else base
    env = {k: v for k, v in base.items() if _allowed(k, policy.env_allow) and not SECRET_NAME.search(k)}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.setdefault("LANG", "C.UTF-8")
    for name, sub in ENV_WORKDIR.items():
        env[name] = os.path.join(policy.workdir, sub) if sub else policy.workdir
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    for k, v in (extra or {}).items():
        if SECRET_NAME.search(k):
            raise ValueError(f"executor_env: {k!r} looks like a secret; pass it over the channel, not the environment")
        env[k] = str(v)
    return env


def _prepare_workdir(policy: SandboxPolicy, env: Mapping[str, str]) -> None:
    for name, sub in ENV_WORKDIR.items():
        if sub and env.get(name, "").startswith(policy.workdir):
            os.makedirs(env[name], exist_ok=True)


def _read_status(fd: int, timeout: float) -> list[dict]:
    """The launcher's and the executor's JSON lines, until EOF (the executor closed it at exec)."""
    buf, deadline = b"", time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise SandboxError(f"sandbox did not report within {timeout:.0f} s")
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buf += chunk
    return [json.loads(line) for line in buf.decode().splitlines() if line.strip()]


def spawn(argv: Sequence[str], policy: SandboxPolicy, *, env: Mapping[str, str] | None = None,
          pass_fds: Sequence[int] = (), cwd: str | None = None, stdin=subprocess.DEVNULL, stdout=None,
          stderr=None, probe_only: bool = False, start_timeout_s: float = 30.0) -> SandboxedProcess:
    """Start ``argv`` (argv[0] resolved on PATH) confined by ``policy``; returns once the sandbox is
    in force (``.applied``) and argv is being exec'd. ``env`` defaults to ``executor_env(policy)``.
    ``pass_fds`` stay open in the executor at the same numbers, and only there (the launcher closes
    its copies, so the judge sees EOF when the executor dies)."""
    exe = argv[0] if os.sep in argv[0] else (shutil.which(argv[0]) or argv[0])
    env = dict(executor_env(policy) if env is None else env)
    workdir = os.path.abspath(policy.workdir)
    os.makedirs(workdir, exist_ok=True)
    _prepare_workdir(policy, env)
    if policy.run_as and os.getuid() == 0 and "unprivileged_uid" not in policy.disable:
        chown_tree(workdir, policy.run_as)          # the host dir (no tmpfs): the executor's uid writes it
    group, group_why = None, "not asked for"
    if policy.memory_bytes and "memory_cgroup" not in policy.disable:
        group, group_why = cgroup_memory.create(f"{WORKDIR_PREFIX}{uuid.uuid4().hex[:12]}", policy.memory_bytes)
    status_r, status_w = os.pipe()
    lifeline_r, lifeline_w = os.pipe()
    cfg = {"argv": [exe, *argv[1:]], "workdir": os.path.abspath(cwd or workdir),
           "status_fd": status_w, "lifeline_fd": lifeline_r, "close_fds": list(pass_fds),
           "allow_network": policy.allow_network,
           "allow_unix_sockets": policy.allow_unix_sockets, "pid_namespace": policy.pid_namespace,
           "rlimits": policy.rlimits(), "writable": [workdir, *policy.writable],
           "device_files": policy.device_files(), "disable": list(policy.disable), "probe": probe_only,
           "run_as": policy.run_as, "workdir_bytes": policy.workdir_bytes, "reveal": list(policy.reveal),
           "hide": [*policy.hide, os.path.dirname(workdir)], "keep": _keep(exe, env, workdir),
           "cgroup_procs": os.path.join(group, "cgroup.procs") if group else None}
    try:
        popen = subprocess.Popen([sys.executable, "-I", "-S", LAUNCHER, json.dumps(cfg)], env=env,
                                 pass_fds=(status_w, lifeline_r, *pass_fds), stdin=stdin, stdout=stdout,
                                 stderr=stderr, start_new_session=True, cwd=policy.workdir)
    finally:
        os.close(status_w)
        os.close(lifeline_r)
    try:
        lines = _read_status(status_r, start_timeout_s)
    except SandboxError:
        popen.kill()
        os.close(lifeline_w)
        popen.wait()
        cgroup_memory.remove(group)
        raise
    finally:
        os.close(status_r)
    info = {k: v for line in lines for k, v in line.items()}
    if "applied" not in info:
        popen.wait()
        os.close(lifeline_w)
        cgroup_memory.remove(group)
        raise SandboxError(f"sandbox failed before exec: {info.get('error', f'launcher exited {popen.returncode}')}")
    applied, errors = info["applied"], dict(info.get("errors") or {})
    own_group = applied.pop("own_group", False) and applied.get("seccomp", False)    # sealed: none leaves it
    applied["memory_cgroup"] = bool(group) and _holds(group, popen.pid)
    if not applied["memory_cgroup"]:
        errors["memory_cgroup"] = group_why if not group else f"the launcher did not enter {group}"
    namespaces = {k: applied.pop(f"ns_{k}") for k in ("user", "pid", "net", "mnt") if f"ns_{k}" in applied}
    own = {k: os.readlink(f"/proc/self/ns/{k}") for k in namespaces}
    namespaces = {k: v for k, v in namespaces.items() if v != own[k]}     # only the sandbox's own
    view, view_fd = workdir, None
    if applied.get("workdir_tmpfs"):      # the tmpfs lives in the sandbox's mount namespace: reach it there
        view_fd = os.open(f"/proc/{popen.pid}/root{workdir}", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        view = f"/proc/{os.getpid()}/fd/{view_fd}"
    executor = int(info.get("executor", -1))
    return SandboxedProcess(popen, lifeline_w, executor, SandboxCapabilities.from_status(applied, errors), namespaces,
                            view, view_fd, group, group=executor if own_group and executor > 0 else None)


def _holds(group: str, pid: int) -> bool:
    try:
        with open(os.path.join(group, "cgroup.procs")) as f:
            return str(pid) in f.read().split()
    except OSError:
        return False


def _keep(exe: str, env: Mapping[str, str], workdir: str) -> list[str]:
    """What the executor must read to run at all (bound back under a hidden dir; its uid must reach them):
    the interpreter, its prefixes, this package, PYTHONPATH. Anything else it needs goes in its workdir."""
    paths = [exe, sys.prefix, sys.base_prefix, REPO, *env.get("PYTHONPATH", "").split(os.pathsep)]
    workdir = workdir.rstrip("/") + "/"
    return sorted({p for p in paths if p and not p.startswith(workdir)})


@functools.cache
def probe(device: str = "cpu") -> SandboxCapabilities:
    """What this machine's kernel lets an executor have under ``device``'s policy (``for_device``): a
    launcher confines a child fully, which reports and exits (~50 ms, once per process and device kind;
    no GPU needed: the CUDA policy's files, uid and sockets are probed the same way)."""
    scratch.remove_stale("probe")           # those of probing processes that were killed
    home = scratch.owned_dir("probe")
    try:
        with spawn(["/bin/true"], SandboxPolicy.for_device(device, make_workdir(home)), probe_only=True) as proc:
            proc.wait(10)
            proc.release_workdir()
            return proc.applied
    except (SandboxError, OSError, subprocess.TimeoutExpired) as e:
        return SandboxCapabilities(errors=(("spawn", str(e)),))
    finally:
        scratch.release(home)


def require_sandbox(author_is_llm: bool, unsafe: bool, caps: SandboxCapabilities | None = None) -> SandboxCapabilities:
    """The policy: LLM-written candidates run only in a complete sandbox unless ``unsafe`` (the CLI's
    ``--unsafe-no-sandbox``). Returns the capabilities (to attach to verdicts); raises UnsafeSandbox."""
    caps = probe() if caps is None else caps
    if author_is_llm and not unsafe and not caps.complete():
        raise UnsafeSandbox("the executor sandbox is incomplete on this machine (missing: "
                            + "; ".join(caps.missing()) + "): LLM-written candidates are refused; "
                            "see `tkcc doctor`, or pass --unsafe-no-sandbox to run them anyway")
    return caps
