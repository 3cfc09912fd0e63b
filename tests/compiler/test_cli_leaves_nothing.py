"""Issue 38, "no file or process left after any check": ``tkcc candidate check`` (an honest candidate and a
hostile one that forks, writes files and reserves 256 MiB) and ``tkcc plan apply`` run with a private
``TMPDIR``; once each exits, that directory is empty and no process carries it in its environment (the
engine inherits it, executors get a ``TMPDIR`` inside it). Plan modules (``scratch.module_dir``) live as
long as their process: a Triton kernel of a loaded module still compiles and runs after another process
swept stale directories, and a killed process's module directory is removed by the next one to start."""

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from compiler.plan import artifact as plan_mod
from compiler.plan.compose import Part, compose
from persistent_engine.io_struct import WorkloadPoint
from plan_samples import make_plan

CANDIDATES = Path(__file__).parents[1] / "persistent_engine" / "candidates"
KERNELS = Path(__file__).with_name("candidates")
POINTS = (WorkloadPoint(phase="decode", batch=2, context=40, chunk=1, weight=1.0),)


def _carrying(text: str) -> list[int]:
    """Live processes whose environment mentions ``text``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if text.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


def _run(tmp: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(Path(__file__).parents[2])}
    return subprocess.run([sys.executable, "-m", "compiler", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def _assert_nothing_left(tmp: Path) -> None:
    deadline = time.monotonic() + 10                # the launchers' kill of a tree is asynchronous
    while (_carrying(str(tmp)) or list(tmp.iterdir())) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _carrying(str(tmp)) == []
    assert sorted(p.name for p in tmp.iterdir()) == []


@pytest.mark.parametrize("name", ["good_torch", "leaves_a_mess"])
def test_candidate_check_leaves_no_file_and_no_process(name, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = _run(tmp, "candidate", "check", str(CANDIDATES / f"{name}.py"), "--model", "tiny-dense",
               "--device", "cpu", "--samples", "3")
    assert out.returncode in (0, 1), out.stderr[-2000:]
    _assert_nothing_left(tmp)


def test_plan_apply_leaves_no_file_and_no_process(tmp_path):
    sources = {n: (KERNELS / f"{n}.py").read_text() for n in ("linear_fp32", "fused_add_rms_norm_fp32")}
    opts = tuple(plan_mod.PlanOptimization(name=n, targets=(), speedup={"fast": 1.2, "slow": 1.1},
                                       kernel=f"kernels/{n}.py") for n in sources)
    vdir = plan_mod.write_version(tmp_path / "plan", make_plan(optimizations=opts, workload_points=POINTS),
                                  sources={f"kernels/{n}.py": s for n, s in sources.items()},
                                  composed_source=compose([Part(n, s) for n, s in sources.items()]), profile=None)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = _run(tmp, "plan", "apply", "--plan", str(vdir))
    assert out.returncode == 0, out.stderr[-2000:]
    _assert_nothing_left(tmp)


TRITON_MODULE = textwrap.dedent("""
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def _twice(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)


    def twice(x):
        out = torch.empty_like(x)
        _twice[(triton.cdiv(x.numel(), 64),)](x, out, x.numel(), BLOCK=64)
        return out


    OVERRIDES = {}
""")

LOAD_SWEEP_RUN = textwrap.dedent("""
    import os, subprocess, sys
    from pathlib import Path
    import torch
    from compiler.plan.apply import load_module
    module = load_module(Path(sys.argv[1]))
    # another process sweeps stale directories while this module lives: its directory stays
    subprocess.run([sys.executable, "-c", "from persistent_engine import scratch; scratch.remove_stale('modules')"],
                   check=True)
    assert os.path.isfile(module.__file__)
    x = torch.arange(200, dtype=torch.float32)
    assert torch.equal(module.twice(x), 2 * x)       # compiled (interpreted) only now, after the sweep
    print(module.__file__)
""")


def test_a_loaded_triton_module_runs_after_a_sweep_and_its_directory_goes_at_exit(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    src = tmp_path / "twice.py"
    src.write_text(TRITON_MODULE)
    env = {**os.environ, "TMPDIR": str(tmp), "TRITON_INTERPRET": "1",
           "PYTHONPATH": str(Path(__file__).parents[2])}
    killed = subprocess.run([sys.executable, "-c", "import os, sys; from pathlib import Path; "
                             "from compiler.plan.apply import load_module; load_module(Path(sys.argv[1])); os._exit(0)",
                             str(src)], env=env, capture_output=True, text=True, timeout=120)
    assert killed.returncode == 0, killed.stderr[-2000:]
    left = [p.name for p in tmp.iterdir()]
    assert len(left) == 1 and left[0].startswith("tkcc-modules-")     # no atexit ran: left for the next
    out = subprocess.run([sys.executable, "-c", LOAD_SWEEP_RUN, str(src)], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    path = Path(out.stdout.strip())
    assert path.parent.name.startswith("tkcc-exec-") and path.parent.parent.name.startswith("tkcc-modules-")
    assert list(tmp.iterdir()) == []                  # the dead one's swept at start, its own at exit
