"""``tkcc engine serve`` end to end: JSON stage lines, the ready line, the 0600 token file, a client
that reads it, and a clean shutdown."""

import json
import os
import stat
import subprocess
import sys

import pytest

from persistent_engine.client import EngineClient
from persistent_engine.server import read_token_file


def test_tkcc_engine_serve_hands_the_token_through_a_private_file(tmp_path):
    token_file = tmp_path / "engine.token"
    env = {k: v for k, v in os.environ.items() if k != "TKCC_ENGINE_TOKEN"}
    proc = subprocess.Popen([sys.executable, "-m", "compiler", "engine", "serve", "--model", "tiny-dense",
                             "--layers", "1", "--token-file", str(token_file)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        stages, ready = [], None
        for line in proc.stdout:
            obj = json.loads(line)
            if "stage" in obj:
                stages.append(obj["stage"])
            else:
                ready = obj
                break
        assert ready and ready["ready"] is True, proc.stderr.read() if proc.poll() is not None else ready
        assert stages == ["process", "imports", "weights", "kv_cache", "warmup", "calibration", "graph_capture"]
        assert ready["token_file"] == str(token_file) and ready["layers"] == [0]
        assert ready["address"].startswith("tcp://127.0.0.1:")
        assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
        client = EngineClient(ready["address"], read_token_file(str(token_file)), timeout_s=60)
        st = client.status()
        assert st.ok and st.model == "tiny-dense" and st.pid == proc.pid
        assert not EngineClient(ready["address"], "x" * 64, timeout_s=60).status().ok
        assert client.shutdown().ok
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_tkcc_engine_serve_tiny_serves_glm52_at_toy_size(tmp_path):
    token_file = tmp_path / "engine.token"
    env = {k: v for k, v in os.environ.items() if k != "TKCC_ENGINE_TOKEN"}
    proc = subprocess.Popen([sys.executable, "-m", "compiler", "engine", "serve", "--model", "glm", "--tiny",
                             "--token-file", str(token_file)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        ready = None
        for line in proc.stdout:
            obj = json.loads(line)
            if "stage" not in obj:
                ready = obj
                break
        assert ready and ready["ready"] is True, proc.stderr.read() if proc.poll() is not None else ready
        assert ready["layers"] == [0, 1, 2]                   # dense + full indexer, MoE + full, MoE + shared
        client = EngineClient(ready["address"], read_token_file(str(token_file)), timeout_s=60)
        assert client.status().model == "glm+tiny"
        assert client.shutdown().ok
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
