"""Issue 38: nothing left behind. A candidate that reserves 128 MiB with ``posix_fallocate`` and locks a tree
with ``chmod 000`` is checked on a real judge: its executor's directory is gone once its check ends, and
when the judge exits no directory of it (``tkcc-judge-*``, ``tkcc-supervisor-*``) and no process of it
(executors, their launchers) is left. Directories of judges that died are removed by the next one to start;
those of live ones, and those without an owner file, are left alone."""

import glob
import os
import pathlib
import subprocess
import sys
import time

from persistent_engine import scratch
from persistent_engine.supervisor import Supervisor

HERE = pathlib.Path(__file__).parent / "candidates"


def _descendants(pid: int) -> set[int]:
    """Every live process whose parent chain reaches ``pid``."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out.update(kids)
        todo += kids
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _judge_dir(pid: int, supervisor_dir: str) -> str:
    """The judge's directory: inside its supervisor's (``scratch.SCRATCH_ENV``)."""
    for d in glob.glob(os.path.join(supervisor_dir, "tkcc-judge-*")):
        try:
            if pathlib.Path(d, scratch.OWNER_FILE).read_text() == str(pid):
                return d
        except OSError:
            pass
    raise AssertionError(f"no judge directory of {pid}")


def _big_files(root: str) -> list[str]:
    found = []
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            try:
                if os.lstat(p).st_blocks * 512 >= 32 << 20:
                    found.append(p)
            except OSError:
                pass
    return found


def test_a_check_leaves_no_file_and_no_process():
    sup = Supervisor("tiny-dense", device="cpu", start_timeout_s=300)
    sup.start()
    try:
        v = sup.evaluate((HERE / "fills_disk.py").read_text(), timeout_s=180, samples=4)
        assert v.correct, v.reasons
        judge = _judge_dir(sup.proc.pid, sup._dir)
        t0 = time.monotonic()
        while _big_files(judge) and time.monotonic() - t0 < 20:        # removed by the reaper, off the cycle
            time.sleep(0.2)
        assert _big_files(judge) == []
        assert not any("locked" in dirs for _, dirs, _ in os.walk(judge))
        procs = _descendants(sup.proc.pid)
        assert procs                                                   # the baseline's and the pool's
        supervisor_dir = sup._dir
    finally:
        sup.close()
    t0 = time.monotonic()
    while any(_alive(p) for p in procs) and time.monotonic() - t0 < 20:
        time.sleep(0.2)
    assert not [p for p in procs if _alive(p)]
    assert not os.path.exists(judge) and not os.path.exists(supervisor_dir)


def test_an_owner_that_exits_removes_its_directories(tmp_path):
    code = "from persistent_engine import scratch; print(scratch.owned_dir('judge'), scratch.module_dir())"
    made = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "TMPDIR": str(tmp_path)}).stdout.split()
    assert len(made) == 2 and made[1].startswith(str(tmp_path))
    assert list(tmp_path.iterdir()) == []                             # released at exit (atexit)


def test_directories_of_dead_owners_are_removed_and_live_ones_kept(tmp_path):
    code = ("import os; from persistent_engine import scratch; "       # killed: no atexit runs
            "d = scratch.owned_dir('judge'); open(d + '/x', 'w').write('x'); print(d, flush=True); os._exit(0)")
    dead = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "TMPDIR": str(tmp_path)}).stdout.strip()
    os.makedirs(os.path.join(dead, "locked"))
    os.chmod(os.path.join(dead, "locked"), 0)
    old = tmp_path / "tkcc-judge-legacy"                             # no owner file: not judged
    old.mkdir()
    live = scratch.owned_dir("judge")                                 # this process's: alive
    try:
        assert os.path.isdir(dead)
        assert scratch.remove_stale("judge", str(tmp_path)) == [dead]
        assert not os.path.exists(dead) and old.is_dir()
        assert live not in scratch.remove_stale("judge") and os.path.isdir(live)
    finally:
        scratch.release(live)
    assert not os.path.exists(live)


def test_a_tree_whose_top_will_not_go_leaves_its_parent_as_it_was(tmp_path, monkeypatch):
    """When the last rmdir of a tree fails (a writer racing the removal), the rights given back stay inside
    the tree: the parent keeps its mode. (Before, ``/tmp`` became 0700 and the test PostgreSQL, running as
    another user, lost its data directory mid-run.)"""
    parent = tmp_path / "shared"
    parent.mkdir()
    parent.chmod(0o1777)
    tree = parent / "tkcc-judge-x"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "f").write_text("x")
    real = os.rmdir
    monkeypatch.setattr(os, "rmdir", lambda p, *a, **k: (_ for _ in ()).throw(OSError(39, "busy"))
                        if os.path.abspath(p) == str(tree) else real(p, *a, **k))
    scratch.remove_tree(str(tree))
    assert oct(parent.stat().st_mode & 0o7777) == oct(0o1777)


def test_a_sweep_never_takes_a_directory_whose_owner_is_still_locking_it(tmp_path):
    """``owned_dir`` names its lock ``.owner`` only once it holds it: a concurrent ``remove_stale`` (two tiers'
    supervisors starting together) cannot remove a directory being made."""
    made = scratch.owned_dir("race", str(tmp_path))
    assert os.listdir(made) == [scratch.OWNER_FILE]
    assert scratch.remove_stale("race", str(tmp_path)) == [] and os.path.isdir(made)
    scratch.release(made)
