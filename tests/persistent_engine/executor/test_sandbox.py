"""The executor sandbox against real hostile processes (tests/persistent_engine/candidates/*.py).

Each confinement class is attacked by a candidate that reaches ``os``/``socket`` through an allowed
module (the static filter passes it) and runs in a sandboxed python (no torch import: fast); the
test then checks from outside that the attack left nothing: no secret in its loot, no connection at
the test's listeners, no file outside the workdir, no process alive after ``kill_all``. Each class
runs under the full sandbox, under each mechanism alone that claims to cover it (so the fallbacks
on a machine without the others are tested too), and unconfined (the control: the attack works
there, so the test can fail). Every test prints the mechanisms it found; a test whose mechanism this
kernel lacks is skipped with the probe's reason.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from persistent_engine.candidate import static_check
from persistent_engine.executor import sandbox as sb
from persistent_engine.executor import sandboxed_process

CANDIDATES = Path(__file__).resolve().parents[1] / "candidates"
RUNNER = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='candidate')"
EVERYTHING = sb.MECHANISMS
# config name -> mechanisms disabled; "unconfined" is the control
ONLY = {
    "full": (),
    "net_namespace": tuple(m for m in EVERYTHING if m not in ("user_namespace", "net_namespace")),
    "seccomp": tuple(m for m in EVERYTHING if m != "seccomp"),
    "landlock": tuple(m for m in EVERYTHING if m != "landlock"),
    "pid_namespace": tuple(m for m in EVERYTHING if m not in ("user_namespace", "pid_namespace", "mount_namespace")),
    "readonly_root": tuple(m for m in EVERYTHING if m not in ("user_namespace", "mount_namespace")),
    "no_pid_namespace": ("pid_namespace",),
    "unconfined": EVERYTHING,
}
NEEDS = {"full": (), "net_namespace": ("net_namespace",), "seccomp": ("seccomp",), "landlock": ("landlock_fs",),
         "pid_namespace": ("pid_namespace", "private_proc"), "readonly_root": ("readonly_root",), "no_pid_namespace": (), "unconfined": ()}


@pytest.fixture(scope="module")
def caps() -> sb.SandboxCapabilities:
    found = sb.probe()
    print("sandbox mechanisms found:", found.as_dict(), "missing:", found.missing() or "none")
    return found


def _need(caps: sb.SandboxCapabilities, config: str) -> None:
    lacking = [m for m in NEEDS[config] if not getattr(caps, m)]
    if lacking:
        pytest.skip(f"this kernel lacks {lacking} (probe errors: {dict(caps.errors)})")


def _run(name: str, workdir: str, config: str, target: dict | None = None, marker: str = "",
         env: dict | None = None, wait: bool = True, **policy) -> sb.SandboxedProcess:
    if target is not None:
        Path(workdir, "target.json").write_text(json.dumps(target))
    pol = sb.SandboxPolicy(workdir=workdir, disable=ONLY[config], **policy)
    proc = sb.spawn([sys.executable, "-c", RUNNER, str(CANDIDATES / f"{name}.py"), marker], pol, env=env)
    print(f"{name} [{config}] applied:", {k: v for k, v in proc.applied.as_dict().items() if v})
    if wait:
        assert proc.wait(20) == 0
    return proc


def _loot(workdir: str, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return json.loads(Path(workdir, "loot.json").read_text())
        except (OSError, ValueError):
            time.sleep(0.01)
    raise AssertionError("the candidate wrote no loot.json")


def test_hostile_candidates_pass_the_static_filter():
    """The static checks are a first filter only: every hostile candidate here gets through them."""
    for name in ("steals_env", "network", "writes_outside", "daemonizes", "detects_harness"):
        assert static_check((CANDIDATES / f"{name}.py").read_text(), {"fused_add_rms_norm": ["x", "residual", "weight", "eps"]}) == [], name


def test_probe_covers_every_class_here(caps):
    d = caps.as_dict()
    assert set(sb.CLASSES) == set(caps.classes())
    assert d["complete"] == (caps.missing() == ())
    assert all(isinstance(v, (bool, int)) for v in d.values())
    if not caps.complete():
        pytest.skip(f"sandbox incomplete on this machine: {caps.missing()}")


# ------------------------------------------------------------------------------------ secrets
# the orchestrator holding API keys, as an ordinary (capability-less) user runs it: as root with full
# capabilities its /proc/PID/environ is out of reach of a capability-less reader anyway
_ORCHESTRATOR = (["setpriv", "--bounding-set=-all", "--inh-caps=-all", "sleep", "30"] if os.getuid() == 0
                 else ["sleep", "30"])

@pytest.mark.parametrize("config", ["full", "pid_namespace", "landlock", "unconfined"])
def test_env_secrets_unreadable(config, caps, tmp_path, monkeypatch):
    _need(caps, config)
    secret = f"sk-test-{uuid.uuid4().hex}"
    monkeypatch.setenv("ANTHROPIC_API_KEY", secret)
    monkeypatch.setenv("TKCC_ENGINE_TOKEN", secret)
    holder = subprocess.Popen(_ORCHESTRATOR, env={**os.environ, "OPENAI_API_KEY": secret})
    try:
        workdir = sb.make_workdir(str(tmp_path))
        _run("steals_env", workdir, config).kill_all()
        loot = json.dumps(_loot(workdir))
    finally:
        holder.kill()
        holder.wait()
    assert secret not in json.dumps(sb.executor_env(sb.SandboxPolicy(workdir=workdir)))
    if config == "unconfined":
        assert secret in loot, "control: an unconfined process reads the orchestrator's environ"
    else:
        assert secret not in loot


# ------------------------------------------------------------------------------------ network
@pytest.fixture()
def listeners(tmp_path):
    tcp = socket.create_server(("127.0.0.1", 0))
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    abstract_name = f"tkcc-test-{uuid.uuid4().hex}"
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract.bind("\0" + abstract_name)
    abstract.listen(4)
    path = str(tmp_path / "service.sock")
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(path)
    unix.listen(4)
    socks = {"tcp_connect": tcp, "udp_send": udp, "abstract_unix": abstract, "pathname_unix": unix}
    for s in socks.values():
        s.setblocking(False)
    target = {"tcp": tcp.getsockname()[1], "udp": udp.getsockname()[1], "abstract": abstract_name,
              "unix": path, "linger_s": 10}
    yield target, socks
    for s in socks.values():
        s.close()


def _reached(sock: socket.socket) -> bool:
    try:
        if sock.type == socket.SOCK_DGRAM:
            sock.recv(64)
        else:
            sock.accept()[0].close()
        return True
    except BlockingIOError:
        return False


def _outside_connects(port) -> bool:
    if not isinstance(port, int):
        return False
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


# config -> the attempts that config must stop (the rest are outside what it covers)
NET_COVERS = {
    "full": ("tcp_connect", "udp_send", "abstract_unix", "pathname_unix", "tcp_listen"),
    "seccomp": ("tcp_connect", "udp_send", "abstract_unix", "pathname_unix", "tcp_listen"),
    "net_namespace": ("tcp_connect", "udp_send", "abstract_unix", "tcp_listen"),
    "landlock": ("tcp_connect", "tcp_listen"),
    "unconfined": (),
}


@pytest.mark.parametrize("config", list(NET_COVERS))
def test_network_unreachable_both_ways(config, caps, tmp_path, listeners):
    _need(caps, config)
    target, socks = listeners
    workdir = sb.make_workdir(str(tmp_path))
    with _run("network", workdir, config, target=target, wait=False) as proc:
        loot = _loot(workdir)
        listened_reachable = _outside_connects(loot["tcp_listen"])
    print("attempts:", loot)
    reached = {name: _reached(s) for name, s in socks.items()}
    reached["tcp_listen"] = listened_reachable
    if proc.applied.landlock_abi < 6 and config == "landlock":
        pytest.skip("Landlock ABI < 6: abstract sockets not scoped")
    for attempt in NET_COVERS[config]:
        assert not reached[attempt], f"{attempt} got through under {config}: {loot[attempt]}"
    if config == "unconfined":
        assert reached["tcp_connect"] and reached["udp_send"] and listened_reachable, "control"


# ------------------------------------------------------------------------------------ writes
@pytest.mark.parametrize("config", ["full", "readonly_root", "landlock", "unconfined"])
def test_no_write_outside_the_workdir(config, caps, tmp_path):
    _need(caps, config)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "existing").write_text("original")
    os.chmod(outside / "existing", 0o644)
    marker = f"tkcc-escaped-{uuid.uuid4().hex}"
    workdir = sb.make_workdir(str(tmp_path))
    try:
        _run("writes_outside", workdir, config,
             target={"outside_dir": str(outside), "existing": str(outside / "existing"), "marker": marker}).kill_all()
        print("attempts:", _loot(workdir))
        state = (sorted(p.name for p in outside.iterdir()),
                 (outside / "existing").read_text() if (outside / "existing").exists() else None,
                 oct((outside / "existing").stat().st_mode & 0o777) if (outside / "existing").exists() else None,
                 os.path.exists(f"/dev/shm/{marker}"))
    finally:
        if os.path.exists(f"/dev/shm/{marker}"):
            os.unlink(f"/dev/shm/{marker}")
    if config == "unconfined":
        assert state != (["existing"], "original", "0o644", False), "control: unconfined writes land"
    elif config == "landlock":                  # Landlock does not cover chmod/utime/xattrs
        assert state[:2] == (["existing"], "original") and not state[3]
    else:
        assert state == (["existing"], "original", "0o644", False)


# ------------------------------------------------------------------------------------ daemons
def _survivors(marker: str) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if marker.encode() in cmdline and state != "Z":
                out.append(int(entry))
    return out


def _beats(workdir: str) -> int:
    try:
        return int(Path(workdir, "heartbeat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return -1


def _wait_beats(workdir: str, n: int = 3, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while _beats(workdir) < n:
        assert time.monotonic() < deadline, "the daemon never beat"
        time.sleep(0.01)


def _assert_dead(marker: str, workdir: str) -> None:
    """No process of the candidate alive 1 s after the end, and the heartbeat has stopped."""
    deadline = time.monotonic() + 1.0
    while _survivors(marker) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _survivors(marker) == []
    before = _beats(workdir)
    time.sleep(0.1)
    assert _beats(workdir) == before, "the daemon still beats"


@pytest.mark.parametrize("config", ["full", "no_pid_namespace"])
@pytest.mark.parametrize("ending", ["kill_all", "executor_exits", "judge_dies"])
def test_no_daemon_survives(config, ending, caps, tmp_path):
    _need(caps, config)
    marker = f"tkcc-daemon-{uuid.uuid4().hex}"
    workdir = sb.make_workdir(str(tmp_path))
    target = {"marker": marker, "exit": ending == "executor_exits", "linger_s": 30}
    if ending == "judge_dies":
        Path(workdir, "target.json").write_text(json.dumps(target))
        judge = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from persistent_engine.executor import sandbox as sb
            p = sb.spawn([sys.executable, "-c", {RUNNER!r}, {str(CANDIDATES / 'daemonizes.py')!r}, {marker!r}],
                         sb.SandboxPolicy(workdir={workdir!r}, disable={ONLY[config]!r}))
            print(p.pid, flush=True)
            time.sleep(60)""")], stdout=subprocess.PIPE, text=True)
        judge.stdout.readline()
        _wait_beats(workdir)
        judge.kill()
        judge.wait()
    else:
        proc = _run("daemonizes", workdir, config, target=target, marker=marker, wait=False)
        if ending == "executor_exits":                            # the launcher kills what it left
            assert proc.wait(10) == 0
            assert _beats(workdir) >= 1
        else:
            _wait_beats(workdir)
            assert len(_survivors(marker)) >= 3                   # candidate, daemon, shell
            proc.kill_all()
    _assert_dead(marker, workdir)


def test_control_daemon_outlives_an_unsandboxed_parent(tmp_path):
    """Without the sandbox the same candidate leaves its daemon running (so the test above can fail)."""
    marker = f"tkcc-daemon-{uuid.uuid4().hex}"
    Path(tmp_path, "target.json").write_text(json.dumps({"marker": marker, "exit": True}))
    subprocess.run([sys.executable, "-c", RUNNER, str(CANDIDATES / "daemonizes.py"), marker], cwd=tmp_path,
                   check=True, timeout=20, start_new_session=True)
    left = _survivors(marker)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert len(left) >= 2


@pytest.mark.parametrize("config", ["full", "no_pid_namespace"])
def test_sigstop_freezes_the_whole_tree(config, caps, tmp_path):
    """send_signal(SIGSTOP) reaches the setsid daemon too: nothing of the candidate runs while the
    other side of an A/B is timed."""
    _need(caps, config)
    workdir = sb.make_workdir(str(tmp_path))
    marker = f"tkcc-daemon-{uuid.uuid4().hex}"
    with _run("daemonizes", workdir, config, target={"marker": marker, "linger_s": 30}, marker=marker,
              wait=False) as proc:
        _wait_beats(workdir)
        stopped = proc.send_signal(signal.SIGSTOP)
        assert len(stopped) >= 4                                  # launcher, candidate, daemon, sleep
        time.sleep(0.05)
        frozen = _beats(workdir)
        time.sleep(0.2)
        assert _beats(workdir) == frozen
        proc.send_signal(signal.SIGCONT)
        time.sleep(0.2)
        assert _beats(workdir) > frozen
    _assert_dead(marker, workdir)


# ------------------------------------------------------------------------------------ harness-blind
def test_harness_and_serving_look_the_same(caps, tmp_path):
    """The judge's environment (pytest's variables, the engine token, API keys) and the serving
    process's differ; the candidate sees the same thing in both, but for its workdir's name."""
    judged = {**os.environ, "PYTEST_CURRENT_TEST": "x", "TKCC_ENGINE_TOKEN": "t0k", "ANTHROPIC_API_KEY": "sk",
              "TKCC_ENGINE_PARENT_PID": "1"}
    served = {k: v for k, v in os.environ.items() if "PYTEST" not in k} | {"SSH_AUTH_SOCK": "/run/agent",
                                                                           "OPENAI_BASE_URL": "http://x"}
    seen = []
    for base in (judged, served):
        workdir = sb.make_workdir(str(tmp_path))
        env = sb.executor_env(sb.SandboxPolicy(workdir=workdir), base=base)
        _run("detects_harness", workdir, "full", env=env).kill_all()
        _loot(workdir)
        seen.append(json.loads(Path(workdir, "loot.json").read_text().replace(workdir, "<workdir>")))
    assert seen[0] == seen[1]
    assert seen[0]["suspicious"] == []


# ------------------------------------------------------------------------------------ limits, fds, env
def _python(workdir: str, code: str, **policy) -> sb.SandboxedProcess:
    return sb.spawn([sys.executable, "-c", textwrap.dedent(code)], sb.SandboxPolicy(workdir=workdir, **policy),
                    stderr=subprocess.DEVNULL)


def test_rlimits_hold(tmp_path):
    w = sb.make_workdir(str(tmp_path))
    code = """
        import errno, sys
        try:
            open('big', 'wb').write(b'x' * 2_000_000)      # python ignores SIGXFSZ: write fails EFBIG
        except OSError as e:
            sys.exit(5 if e.errno == errno.EFBIG else 1)
        """
    assert _python(w, code, max_file_bytes=1_000_000).wait(10) == 5
    assert os.path.getsize(os.path.join(w, "big")) <= 1_000_000
    assert _python(w, "b = bytearray(2 << 30)", address_space_bytes=1 << 30).wait(10) == 1     # MemoryError


def test_process_limit_holds(caps, tmp_path):
    if os.getuid() == 0 and not caps.unprivileged_uid:
        pytest.skip("RLIMIT_NPROC does not bind uid 0 (the kernel exempts the root user, in any namespace)")
    w = sb.make_workdir(str(tmp_path))
    code = """
        import os
        kids = []
        for _ in range(40):
            try:
                pid = os.fork()
            except OSError:
                raise SystemExit(7)
            if pid == 0:
                import time; time.sleep(5); os._exit(0)
        """
    assert _python(w, code, max_processes=16).wait(10) == 7


def test_privileged_calls_refused(caps, tmp_path):
    _need(caps, "seccomp")
    w = sb.make_workdir(str(tmp_path))
    code = """
        import ctypes, os, sys
        libc = ctypes.CDLL(None, use_errno=True)
        bad = []
        if libc.unshare(0x10000000) == 0: bad.append("unshare")
        if libc.ptrace(16, os.getppid() or 1, 0, 0) == 0: bad.append("ptrace")
        if libc.mount(b"none", b"/", None, 1 << 18, None) == 0: bad.append("mount")
        if libc.syscall(425, 8, None) >= 0: bad.append("io_uring")
        sys.exit(len(bad))
        """
    assert _python(w, code).wait(10) == 0


def test_pass_fds_is_the_channel_and_eof_means_dead(tmp_path):
    judge_end, exec_end = socket.socketpair()
    w = sb.make_workdir(str(tmp_path))
    code = f"""
        import socket
        s = socket.socket(fileno={exec_end.fileno()})
        s.sendall(s.recv(16)[::-1])
        """
    proc = sb.spawn([sys.executable, "-c", textwrap.dedent(code)], sb.SandboxPolicy(workdir=w),
                    pass_fds=(exec_end.fileno(),))
    exec_end.close()
    judge_end.sendall(b"abc")
    assert judge_end.recv(16) == b"cba"
    assert proc.wait(10) == 0
    judge_end.settimeout(5)
    assert judge_end.recv(16) == b""            # nobody else holds the executor's end
    proc.kill_all()


def test_executor_env_is_an_allow_list(tmp_path):
    pol = sb.SandboxPolicy(workdir=str(tmp_path))
    env = sb.executor_env(pol, base={"PATH": "/bin", "ANTHROPIC_API_KEY": "k", "TKCC_ENGINE_TOKEN": "t",
                                     "TRITON_CACHE_DIR": "/shared", "TORCH_HUB_TOKEN": "t", "PYTHONPATH": "/p",
                                     "HOME": "/root", "DATABASE_URL": "postgres://", "CUDA_VISIBLE_DEVICES": "0"})
    assert env["HOME"] == str(tmp_path) and env["TRITON_CACHE_DIR"] == str(tmp_path / "triton")
    assert env["PYTHONPATH"] == "/p" and env["CUDA_VISIBLE_DEVICES"] == "0"
    assert not {"ANTHROPIC_API_KEY", "TKCC_ENGINE_TOKEN", "TORCH_HUB_TOKEN", "DATABASE_URL"} & set(env)
    with pytest.raises(ValueError, match="secret"):
        sb.executor_env(pol, {"TKCC_ENGINE_TOKEN": "t"})


def test_executor_env_keeps_the_math_libraries_numerics_switches(tmp_path):
    # the judge records the reference's MoE routing in its own process: an executor whose cuBLAS picks other
    # GEMM algorithms (another workspace, TF32 forced) would round differently upstream of every router
    base = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "CUBLASLT_WORKSPACE_SIZE": "1024", "NVIDIA_TF32_OVERRIDE": "0",
            "CUBLAS_LOGDEST_DBG": "/x"}
    env = sb.executor_env(sb.SandboxPolicy(workdir=str(tmp_path)), base=base)
    assert {k: env.get(k) for k in base} == {**{k: base[k] for k in list(base)[:3]}, "CUBLAS_LOGDEST_DBG": None}


def test_llm_candidates_need_a_complete_sandbox():
    incomplete = sb.SandboxCapabilities(rlimits=True, no_new_privs=True, subreaper=True)
    with pytest.raises(sb.UnsafeSandbox, match="--unsafe-no-sandbox"):
        sb.require_sandbox(author_is_llm=True, unsafe=False, caps=incomplete)
    assert sb.require_sandbox(author_is_llm=True, unsafe=True, caps=incomplete) is incomplete
    assert sb.require_sandbox(author_is_llm=False, unsafe=False, caps=incomplete) is incomplete
    full = sb.SandboxCapabilities(**{m: True for m in ("net_namespace", "landlock_fs", "pid_namespace",
                                                        "rlimits", "no_new_privs", "seccomp", "seccomp_unix",
                                                        "unprivileged_uid", "hidden_dirs")})
    assert sb.require_sandbox(author_is_llm=True, unsafe=False, caps=full).complete()


# ------------------------------------------------------------------------------------ /proc
PROC_PROBE = textwrap.dedent('''
    import json, os, sys
    out = {}
    def write_back(path):               # the value it already has: harmless if it ever got through
        try:
            value = open(path).read()
            with open(path, "w") as f:
                f.write(value)
            return "written"
        except OSError as e:
            return type(e).__name__
    pid = os.fork()                     # the executor serves from a child of PID 1: the driver's threads live there
    if pid == 0:
        out["thread_name"] = write_back(f"/proc/self/task/{os.getpid()}/comm")
        out["sysctl"] = write_back("/proc/sys/kernel/domainname")
        json.dump(out, open("proc.json", "w"))
        os._exit(0)
    os.waitpid(pid, 0)
''')


def test_thread_names_writable_but_not_global_proc(caps, tmp_path):
    """The CUDA driver fails at init unless it can name its threads (``/proc/<pid>/task/<tid>/comm``,
    measured on the H200): a sandboxed process, forked like the executor, can; a global /proc entry
    (a sysctl) stays refused."""
    _need(caps, "full")
    workdir = sb.make_workdir(str(tmp_path))
    Path(workdir, "probe.py").write_text(PROC_PROBE)
    with sb.spawn([sys.executable, str(Path(workdir, "probe.py"))], sb.SandboxPolicy(workdir=workdir)) as proc:
        assert proc.wait(20) == 0
        print("applied:", {k: v for k, v in proc.applied.as_dict().items() if v})
    got = json.loads(Path(workdir, "proc.json").read_text())
    assert got["thread_name"] == "written", got
    assert got["sysctl"] != "written", got


def test_cuda_policy_allows_unix_sockets_and_says_so():
    """The CUDA driver creates an AF_UNIX socket at init (error 304 without it, on the H200): the cuda
    policy allows them, the CPU one does not, and the verdicts' sandbox line names the difference."""
    from persistent_engine.executor.launch import sandbox_summary
    assert sb.SandboxPolicy.for_device("cuda:0", "/tmp/x").allow_unix_sockets
    assert not sb.SandboxPolicy.for_device("cpu", "/tmp/x").allow_unix_sockets
    assert "AF_UNIX" in sandbox_summary("cuda") and "AF_UNIX" not in sandbox_summary("cpu")


def test_a_stopped_tree_still_dies_with_its_judge(caps, tmp_path):
    """The judge stops the executor while the other side of an A/B is timed; if the judge dies then, the
    lifeline must still end the tree (a stopped launcher would never see it close: found as stopped
    trees left on the machine after killed test runs)."""
    _need(caps, "full")
    workdir = sb.make_workdir(str(tmp_path))
    proc = sb.spawn([sys.executable, "-c", "import time; time.sleep(60)"], sb.SandboxPolicy(workdir=workdir))
    members = proc.send_signal(signal.SIGSTOP)
    assert proc.pid not in members and members
    proc.close_lifeline()                    # what the judge's death does
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") and sandboxed_process._state(p) not in ("Z", "")
                                              for p in members):
        time.sleep(0.05)
    assert not [p for p in members if os.path.exists(f"/proc/{p}") and sandboxed_process._state(p) not in ("Z", "")]
    proc.kill_all()
