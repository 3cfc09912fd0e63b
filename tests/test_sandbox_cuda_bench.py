"""benchmarks/sandbox_cuda.py on CPU: a sandboxed python imports torch and Triton, runs a matmul and a
Triton kernel (interpreter here), and the JSON records what confined it; on the H200 the same script
adds the CUDA device, the Triton cache in the workdir and a CUDA IPC handle from the judge's side."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from persistent_engine.executor import sandbox

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "sandbox_cuda.py"


@pytest.mark.slow
def test_sandboxed_torch_and_triton_on_cpu(tmp_path):
    out = tmp_path / "r.json"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--configs", "full", "--out", str(out)],
                         capture_output=True, text=True, timeout=240, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    doc = json.loads(out.read_text())
    full = doc["results"][0]
    assert full["config"] == "full" and full["ok"] and full["matmul_ok"] and full["triton_ok"]
    assert full["applied"] == sandbox.probe().as_dict()            # everything the kernel offers was in force
    assert "ipc_open_rc" not in full and doc["probe"]["complete"] == sandbox.probe().complete()
    assert "full" in run.stdout and "wrote" in run.stdout
