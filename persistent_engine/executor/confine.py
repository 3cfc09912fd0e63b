"""The sandbox launcher: runs as its own small process (``python -I -S confine.py CONFIG``), stdlib only.

``sandbox.spawn`` starts this file as a script. It (the *launcher*) enters the memory cgroup the judge
made (if any), makes itself a child subreaper, enters fresh user / network / mount / PID namespaces (a
root launcher's *mapper* child maps 0 and an unprivileged ``run_as``: ``confine_fs``), forks the
*executor*, and then only waits:
it reaps whatever the executor leaves behind and, when the executor exits or the judge's lifeline
pipe closes (the judge died or let go), kills every remaining process of the tree and exits with the
executor's status. The forked executor applies, in this order, everything it can of: a private
``/proc`` and ``/dev/shm``, the workdir on a size-limited tmpfs and ``/tmp``, ``/var/tmp``, ``/run`` and
the workdir's parent hidden under empty ones (``confine_fs.private_fs``), every mount read-only but the
workdir, rlimits, no-new-privs, an empty capability bounding set, the unprivileged uid (no groups; the
death signal set again), ``chdir(workdir)``, Landlock (writes only under the workdir and the GPU
device nodes, no TCP, no signals or abstract unix sockets out of the sandbox, no ptrace or ``/proc/PID/environ`` of outside processes),
a seccomp filter (no socket(2) at all by default, socketpair(2) stays; no ptrace, no mount/unshare/setns, no io_uring, no bpf,
no keyrings, no setsid/setpgid: the tree stays in the process group the executor makes first), then
``execve`` of the real argv. Before the exec it writes one JSON line to the status pipe saying which
mechanisms it applied and why others failed; the judge records that line.

CONFIG is one JSON object: ``argv``, ``workdir``, ``status_fd``, ``lifeline_fd``, ``close_fds``,
``allow_network``, ``allow_unix_sockets``, ``pid_namespace``, ``rlimits`` ({name: [soft, hard]}), ``writable`` (dirs),
``device_files`` (files), ``disable`` (mechanisms not to use), ``probe`` (report and exit instead of exec),
``run_as`` (uid, or null), ``workdir_bytes`` (tmpfs size, or null: the host dir), ``hide`` / ``reveal`` /
``keep`` (dirs: covered, bound back, what the executor must read), ``cgroup_procs`` (file, or null).
It imports only the stdlib and its sibling ``confine_fs.py`` (put on ``sys.path`` by hand: ``-I``).

Reads nothing from the environment; passes the environment it was started with to the executor.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import resource
import select
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # -I leaves the script's dir off sys.path
import confine_fs  # noqa: E402 - the sibling module, stdlib only

libc = ctypes.CDLL(None, use_errno=True)

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
CLONE_NEWNAMESPACES = 0x7E020000          # NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 1 << 14, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_CHILD_SUBREAPER = 1, 38, 36
PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2

# Landlock (include/uapi/linux/landlock.h); syscalls 444-446 on every architecture
SYS_landlock_create_ruleset, SYS_landlock_add_rule, SYS_landlock_restrict_self = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION, LANDLOCK_RULE_PATH_BENEATH = 1, 1
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_WRITE_DIR_RIGHTS = sum(1 << b for b in range(4, 13))   # remove dir/file, make char/dir/reg/sock/fifo/block/sym
FS_REFER, FS_TRUNCATE = 1 << 13, 1 << 14                  # ABI 2, ABI 3
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1            # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _check(rc: int, what: str) -> int:
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return rc


def _prctl(option: int, arg: int = 0) -> None:
    _check(libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl({option})")


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 when Landlock is absent or disabled (or the syscall is filtered)."""
    rc = libc.syscall(SYS_landlock_create_ruleset, None, ctypes.c_size_t(0),
                      ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    return max(int(rc), 0)


# ------------------------------------------------------------------------------------ namespaces
def enter_namespaces(allow_network: bool, pid_namespace: bool, disable: list[str],
                     run_as: int | None = None) -> dict[str, bool]:
    """unshare(2) user (+ net, mount, PID) namespaces. A root launcher has its mapper map 0 and ``run_as``
    (``mapped_uid``: the executor drops to it); otherwise the uid/gid stay the same numbers inside."""
    uid, gid = os.getuid(), os.getgid()
    want = {"user_namespace": CLONE_NEWUSER, "mount_namespace": CLONE_NEWNS,
            "net_namespace": 0 if allow_network else CLONE_NEWNET, "pid_namespace": CLONE_NEWPID if pid_namespace else 0}
    want = {k: v for k, v in want.items() if v and k not in disable}
    flags = sum(want.values())
    got = {"user_namespace": False, "mount_namespace": False, "net_namespace": False, "pid_namespace": False}
    if not flags:
        return got
    try:
        if not flags & CLONE_NEWUSER:
            raise OSError(1, "user namespace not wanted")
        mapper = confine_fs.start_mapper(run_as) if run_as and uid == 0 else None
        rc = libc.unshare(flags)
        if mapper and confine_fs.finish_mapper(mapper, rc == 0):
            got["mapped_uid"] = run_as
        _check(rc, "unshare")
        if "mapped_uid" not in got:
            with open("/proc/self/setgroups", "w") as f:
                f.write("deny")
            with open("/proc/self/uid_map", "w") as f:
                f.write(f"{uid} {uid} 1")
            with open("/proc/self/gid_map", "w") as f:
                f.write(f"{gid} {gid} 1")
        got["user_namespace"] = True
    except OSError:
        # no user namespaces (sysctl, container seccomp): a privileged launcher may still unshare the rest
        try:
            if flags & ~CLONE_NEWUSER:
                _check(libc.unshare(flags & ~CLONE_NEWUSER), "unshare")
        except OSError:
            return got
    for name in want:
        got[name] = got[name] or name != "user_namespace"
    return got


def identity(cfg: dict, ns: dict) -> dict:
    """After the mounts and the bounding set: drop to the mapped unprivileged uid, unless it could not read
    what it must run (then stay, and say why). PR_SET_PDEATHSIG is cleared by a uid change: set again."""
    run_as = ns.get("mapped_uid")
    if run_as is None:
        if cfg["run_as"] and "unprivileged_uid" not in cfg["disable"] and os.getuid() == 0:
            raise OSError(1, "no uid map to an unprivileged id (the launcher is not root on the host, or the "
                             "mapper was refused): the executor keeps the host's uid 0")
        return {"unprivileged_uid": os.getuid() != 0 and "unprivileged_uid" not in cfg["disable"]}
    bad = confine_fs.unreadable(cfg["keep"], run_as)
    if bad:
        confine_fs.chown_tree(cfg["workdir"], os.getuid())      # it stays: give it its workdir back
        raise OSError(13, f"uid {run_as} could not read {', '.join(bad)}: the executor keeps uid 0")
    confine_fs.become(run_as)
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    return {"unprivileged_uid": True}


def private_mounts(pid_namespace: bool) -> dict[str, bool]:
    """In the new mount namespace: a /proc that shows only the sandbox's PID namespace, a private /dev/shm."""
    got = {"private_proc": False, "private_shm": False}
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return got
    if pid_namespace:
        got["private_proc"] = libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None) == 0
    if os.path.isdir("/dev/shm"):
        got["private_shm"] = libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", MS_NOSUID | MS_NODEV,
                                        b"mode=1777,size=1g") == 0
    return got


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


SYS_mount_setattr, AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY, MS_BIND = 442, -100, 0x8000, 1, 4096


def _mount_setattr(path: str, recursive: bool, set_: int, clear: int) -> None:
    attr = _MountAttr(set_, clear, 0, 0)
    _check(libc.syscall(SYS_mount_setattr, AT_FDCWD, path.encode(), AT_RECURSIVE if recursive else 0,
                        ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr))), f"mount_setattr {path}")


def writable_own_proc() -> None:
    """The private /proc (only this sandbox's processes) writable, but for every entry that is not a
    process (``sys``, ``sysrq-trigger``, ``irq``, ...: bound read-only over themselves). The CUDA
    driver names its threads (``/proc/<pid>/task/<tid>/comm``) in whichever process it runs, and fails
    at init (error 304) when it cannot."""
    _mount_setattr("/proc", False, 0, MOUNT_ATTR_RDONLY)
    for entry in os.listdir("/proc"):
        if entry.isdigit() or entry in ("self", "thread-self"):
            continue
        path = os.path.join("/proc", entry)
        if os.path.islink(path) or libc.mount(path.encode(), path.encode(), None, MS_BIND, None) != 0:
            continue                                             # a symlink or a vanished entry: nothing to write
        _mount_setattr(path, False, MOUNT_ATTR_RDONLY, 0)


def readonly_root(writable: list[str], shm: bool, own_proc: bool) -> dict[str, bool]:
    """Every mount read-only (writes, chmod, utime, xattrs refused: EROFS), then the workdir (and
    ``writable``) bind-mounted over itself read-write, and the private /dev/shm. Device nodes stay
    writable on a read-only mount. Needs mount_setattr(2) (Linux 5.12)."""
    for path in writable:
        _check(libc.mount(path.encode(), path.encode(), None, MS_BIND | MS_REC, None), f"bind {path}")
        _mount_setattr(path, False, MOUNT_ATTR_RDONLY, 0)      # a dry run: can it go read-only and back?
        _mount_setattr(path, False, 0, MOUNT_ATTR_RDONLY)
    _mount_setattr("/", True, MOUNT_ATTR_RDONLY, 0)
    if own_proc:
        writable_own_proc()
    try:
        for path in writable + (["/dev/shm"] if shm else []):
            _mount_setattr(path, False, 0, MOUNT_ATTR_RDONLY)
    except OSError as e:                                        # a read-only workdir: fail, do not limp on
        raise RuntimeError(f"read-only root applied but the workdir stayed read-only: {e}") from None
    return {"readonly_root": True}


def host_view(cfg: dict, owner: int | None) -> dict[str, bool]:
    """The workdir on its own tmpfs, other dirs hidden (``confine_fs.private_fs``), as the policy asks."""
    off = cfg["disable"]
    size = None if "workdir_tmpfs" in off else cfg["workdir_bytes"]
    hide = [] if "hidden_dirs" in off else cfg["hide"]
    got, _ = confine_fs.private_fs(cfg["workdir"], size, owner if "unprivileged_uid" not in off else None,
                                   cfg["writable"], hide, cfg["reveal"], cfg["keep"])
    return got


# ------------------------------------------------------------------------------------ limits, privileges
def apply_rlimits(limits: dict[str, list[int]]) -> bool:
    for name, (soft, hard) in limits.items():
        resource.setrlimit(getattr(resource, name), (soft, hard))
    return True


def drop_privileges() -> dict[str, bool]:
    """no_new_privs (no setuid/file-caps gain at exec), empty bounding and ambient sets (uid 0 execs with no caps)."""
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0) != 0 and ctypes.get_errno() == 22:
            break                                  # EINVAL: past the last capability
    libc.prctl(PR_CAP_AMBIENT, ctypes.c_ulong(PR_CAP_AMBIENT_CLEAR_ALL), 0, 0, 0)
    status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
    bounding = int(status["CapBnd"].strip(), 16)
    return {"no_new_privs": True, "caps_dropped": bounding == 0 or os.getuid() != 0}


# ------------------------------------------------------------------------------------ Landlock
def landlock(abi: int, writable: list[str], device_files: list[str], allow_network: bool,
             own_proc: bool) -> dict[str, bool]:
    """Restrict this process and its future children: every write right handled, granted only beneath
    ``writable`` (dirs) and on ``device_files``; no TCP bind/connect (ABI >= 4) unless allowed; no
    signals / abstract unix sockets out of the domain (ABI >= 6). Reads and exec stay unrestricted."""
    if abi < 1:
        return {"landlock_fs": False, "landlock_net": False, "landlock_scope": False}
    fs = FS_WRITE_FILE | FS_WRITE_DIR_RIGHTS | (FS_REFER if abi >= 2 else 0) | (FS_TRUNCATE if abi >= 3 else 0)
    net = (NET_BIND_TCP | NET_CONNECT_TCP) if abi >= 4 and not allow_network else 0
    scoped = (SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if abi >= 6 else 0
    attr = _RulesetAttr(fs, net, scoped)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    ruleset = _check(libc.syscall(SYS_landlock_create_ruleset, ctypes.byref(attr), ctypes.c_size_t(size),
                                  ctypes.c_uint32(0)), "landlock_create_ruleset")
    try:
        file_rights = FS_WRITE_FILE | (FS_TRUNCATE if abi >= 3 else 0)
        # thread names (.../task/<tid>/comm), which the CUDA driver sets: in a private /proc every process
        # there is the sandbox's own (its global entries are read-only mounts); else this process's only
        own_threads = ["/proc" if own_proc else "/proc/self/task"]
        for path, rights in ([(p, fs) for p in writable] + [(p, file_rights) for p in device_files + own_threads]):
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue                              # a device that is not there: nothing to allow
            try:
                rule = _PathBeneathAttr(rights, fd)
                _check(libc.syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH,
                                    ctypes.byref(rule), ctypes.c_uint32(0)), f"landlock_add_rule {path}")
            finally:
                os.close(fd)
        _check(libc.syscall(SYS_landlock_restrict_self, ruleset, ctypes.c_uint32(0)), "landlock_restrict_self")
    finally:
        os.close(ruleset)
    return {"landlock_fs": True, "landlock_net": bool(net), "landlock_scope": bool(scoped)}


# ------------------------------------------------------------------------------------ seccomp
# (audit arch, x32 bit or 0, syscall numbers) per machine; the denied calls never serve a kernel
SECCOMP_ARCH = {
    "x86_64": (0xC000003E, 0x40000000, dict(
        socket=41, clone=56, clone3=435, ptrace=101, process_vm_readv=310, process_vm_writev=311,
        mount=165, umount2=166, pivot_root=155, chroot=161, unshare=272, setns=308, bpf=321,
        keyctl=250, add_key=248, request_key=249, kexec_load=246, kexec_file_load=320,
        init_module=175, finit_module=313, delete_module=176, reboot=169, swapon=167, swapoff=168,
        name_to_handle_at=303, open_by_handle_at=304, userfaultfd=323, io_uring_setup=425,
        io_uring_enter=426, io_uring_register=427, open_tree=428, move_mount=429, fsopen=430,
        fsconfig=431, fsmount=432, fspick=433, mount_setattr=442)),
    "aarch64": (0xC00000B7, 0, dict(
        socket=198, clone=220, clone3=435, ptrace=117, process_vm_readv=270, process_vm_writev=271,
        mount=40, umount2=39, pivot_root=41, chroot=51, unshare=97, setns=268, bpf=280,
        keyctl=219, add_key=217, request_key=218, kexec_load=104, kexec_file_load=294,
        init_module=105, finit_module=273, delete_module=106, reboot=142, swapon=224, swapoff=225,
        name_to_handle_at=264, open_by_handle_at=265, userfaultfd=282, io_uring_setup=425,
        io_uring_enter=426, io_uring_register=427, open_tree=428, move_mount=429, fsopen=430,
        fsconfig=431, fsmount=432, fspick=433, mount_setattr=442)),
}
# Denied too: leaving the executor's process group. Every descendant then stays in the group the executor
# made first (``confine``), so one killpg(2) stops, continues or kills the whole tree, a child forked
# meanwhile included (the kernel restarts a fork that races a group signal). Triton, inductor and ptxas
# spawn with neither (Popen's start_new_session / process_group default off).
SECCOMP_PGRP = {"x86_64": {"setsid": 112, "setpgid": 109}, "aarch64": {"setsid": 157, "setpgid": 154}}
AF_UNIX = 1
EPERM, ENOSYS, EAFNOSUPPORT = 1, 38, 97
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000
BPF_LD_W_ABS, BPF_JEQ_K, BPF_JGE_K, BPF_JSET_K, BPF_RET_K = 0x20, 0x15, 0x35, 0x45, 0x06


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


def seccomp_program(machine: str, allow_network: bool, allow_unix_sockets: bool) -> list[tuple[int, int, int, int]]:
    """The classic-BPF filter: wrong arch / x32 -> EPERM; denied calls -> EPERM; clone3 -> ENOSYS (libc
    falls back to clone, whose flags are visible); clone with namespace flags -> EPERM; socket(2) ->
    EAFNOSUPPORT unless networking is allowed (AF_UNIX too unless ``allow_unix_sockets``: a pathname
    socket of another service is reachable from any namespace); socketpair(2) stays; the rest allowed."""
    arch, x32, nr = SECCOMP_ARCH[machine]
    deny = [v for k, v in nr.items() if k not in ("socket", "clone", "clone3")]
    deny += SECCOMP_PGRP[machine].values()
    prog: list[tuple[int, int, int, int]] = [(BPF_LD_W_ABS, 0, 0, 4), (BPF_JEQ_K, 1, 0, arch),
                                             (BPF_RET_K, 0, 0, RET_ERRNO | EPERM), (BPF_LD_W_ABS, 0, 0, 0)]
    if x32:
        prog += [(BPF_JGE_K, 0, 1, x32), (BPF_RET_K, 0, 0, RET_ERRNO | EPERM)]
    for n in deny:
        prog += [(BPF_JEQ_K, 0, 1, n), (BPF_RET_K, 0, 0, RET_ERRNO | EPERM)]
    prog += [(BPF_JEQ_K, 0, 1, nr["clone3"]), (BPF_RET_K, 0, 0, RET_ERRNO | ENOSYS)]
    # clone: args[0] (flags, low 32 bits at offset 16) must carry no CLONE_NEW* bit
    prog += [(BPF_JEQ_K, 0, 4, nr["clone"]), (BPF_LD_W_ABS, 0, 0, 16), (BPF_JSET_K, 0, 1, CLONE_NEWNAMESPACES),
             (BPF_RET_K, 0, 0, RET_ERRNO | EPERM), (BPF_RET_K, 0, 0, RET_ALLOW)]
    if not allow_network:
        unix = AF_UNIX if allow_unix_sockets else 0xFFFFFFFF      # 0xFFFFFFFF: no family matches
        prog += [(BPF_JEQ_K, 0, 4, nr["socket"]), (BPF_LD_W_ABS, 0, 0, 16), (BPF_JEQ_K, 1, 0, unix),
                 (BPF_RET_K, 0, 0, RET_ERRNO | EAFNOSUPPORT), (BPF_RET_K, 0, 0, RET_ALLOW)]
    return prog + [(BPF_RET_K, 0, 0, RET_ALLOW)]


def seccomp(allow_network: bool, allow_unix_sockets: bool) -> dict[str, bool]:
    machine = platform.machine()
    if machine not in SECCOMP_ARCH:
        return {"seccomp": False}
    prog = seccomp_program(machine, allow_network, allow_unix_sockets)
    filters = (_SockFilter * len(prog))(*[_SockFilter(*ins) for ins in prog])
    fprog = _SockFprog(len(prog), filters)
    _check(libc.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(fprog), 0, 0), "seccomp")
    return {"seccomp": True, "seccomp_unix": not (allow_network or allow_unix_sockets)}


# ------------------------------------------------------------------------------------ the two processes
def confine(cfg: dict, ns: dict[str, bool]) -> tuple[dict, dict]:
    """In the forked executor, before exec: every mechanism it can; returns (applied, errors)."""
    applied: dict = {"subreaper": True, **ns}
    errors: dict[str, str] = {}

    def attempt(name, fn, *args):
        try:
            applied.update(fn(*args))
        except (OSError, ValueError) as e:
            errors[name] = str(e)

    disable = cfg["disable"]
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)       # the launcher is single-threaded: its death is the tree's
    os.setpgid(0, 0)                               # its own process group (the launcher stays out of it)
    applied["own_group"] = True
    if ns.get("mount_namespace"):
        applied.update(private_mounts(ns.get("pid_namespace", False)))
        attempt("private_fs", host_view, cfg, ns.get("mapped_uid"))
        attempt("readonly_root", readonly_root, cfg["writable"], applied["private_shm"], applied["private_proc"])
    if "rlimits" not in disable:
        attempt("rlimits", lambda: {"rlimits": apply_rlimits(cfg["rlimits"])})
    attempt("privileges", drop_privileges)
    attempt("unprivileged_uid", identity, cfg, ns)
    os.chdir(cfg["workdir"])
    applied["landlock_abi"] = abi = landlock_abi()
    if "landlock" not in disable:
        writable = cfg["writable"] + (["/dev/shm"] if applied.get("private_shm") else [])   # a fresh tmpfs
        attempt("landlock", landlock, abi, writable, cfg["device_files"], cfg["allow_network"],
                applied.get("private_proc", False) and applied.get("readonly_root", False))
    if "seccomp" not in disable:
        attempt("seccomp", seccomp, cfg["allow_network"], cfg["allow_unix_sockets"])
    for key in ("user", "pid", "net", "mnt"):
        applied[f"ns_{key}"] = os.readlink(f"/proc/self/ns/{key}")
    return applied, errors


def _executor(cfg: dict, ns: dict[str, bool]) -> None:
    """The forked child: confine, report, exec. Never returns."""
    try:
        os.close(cfg["lifeline_fd"])
        applied, errors = confine(cfg, ns)
        os.write(cfg["status_fd"], (json.dumps({"applied": applied, "errors": errors}) + "\n").encode())
        os.close(cfg["status_fd"])
        if cfg.get("probe"):
            os._exit(0)
        argv = cfg["argv"]
        os.execve(argv[0], argv, dict(os.environ))
    except BaseException as e:  # noqa: BLE001 - report anything, then die: never run the argv half-confined
        try:
            os.write(cfg["status_fd"], (json.dumps({"error": f"{type(e).__name__}: {e}"}) + "\n").encode())
        except OSError:
            pass
        os._exit(126)


def _children_of(pid: int) -> list[int]:
    """Direct children (adopted orphans included, we are their subreaper) from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def kill_descendants() -> None:
    """SIGKILL every process below this one (stop them first so none forks meanwhile), reap them all."""
    me = os.getpid()
    while True:
        found, frontier = [], [me]
        while frontier:
            kids = _children_of(frontier.pop())
            found += kids
            frontier += kids
        if not found:
            return
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            while os.waitpid(-1, 0)[0] > 0:
                pass
        except ChildProcessError:
            pass


def launcher_main(cfg: dict) -> int:
    """The launcher: subreaper, namespaces, fork the executor, wait, then leave nothing behind."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    if cfg.get("cgroup_procs"):                 # the memory cgroup the judge made: before any fork
        try:
            with open(cfg["cgroup_procs"], "w") as f:
                f.write(str(os.getpid()))
        except OSError:
            pass                                # the judge sees the launcher is not in it, and says so
    run_as = None if "unprivileged_uid" in cfg["disable"] else cfg["run_as"]
    ns = enter_namespaces(cfg["allow_network"], cfg["pid_namespace"], cfg["disable"], run_as)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    stop = []
    signal.signal(signal.SIGCHLD, lambda *_: None)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.append(True))
    child = os.fork()
    if child == 0:
        _executor(cfg, ns)
    os.write(cfg["status_fd"], (json.dumps({"launcher": os.getpid(), "executor": child}) + "\n").encode())
    os.close(cfg["status_fd"])
    for fd in cfg["close_fds"]:                 # the channel ends are the executor's: EOF when it dies
        os.close(fd)
    status = None
    while status is None and not stop:
        readable, _, _ = select.select([cfg["lifeline_fd"], wake_r], [], [])
        if cfg["lifeline_fd"] in readable and not os.read(cfg["lifeline_fd"], 1):
            break                               # the judge closed the lifeline or died
        os.read(wake_r, 512)
        try:
            while True:
                pid, st = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                if pid == child:
                    status = st
        except ChildProcessError:
            break
    kill_descendants()
    if status is None:
        return 137
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)               # die by the same signal: the judge reads -sig
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig if sig != signal.SIGSTOP else signal.SIGKILL)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(launcher_main(json.loads(sys.argv[1])))
