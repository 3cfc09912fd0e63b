"""``tkcc candidate check`` on Qwen3.5 at toy size: the torch template of gated_delta_decode is judged correct,
a candidate that returns the right output but never advances the recurrent state is rejected on the state."""

import os
import pathlib
import subprocess
import sys

import pytest

from agents.templates import Choice, get_template, render_candidate

BAD = pathlib.Path(__file__).with_name("candidates") / "corrupts_state.py"


def _check(path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(pathlib.Path(__file__).parents[2])}
    return subprocess.run([sys.executable, "-m", "compiler", "candidate", "check", str(path), "--model", "qwen3.5",
                           "--tiny", "--device", "cpu", "--samples", "1"], capture_output=True, text=True,
                          timeout=300, env=env)


@pytest.mark.slow
def test_candidate_check_accepts_the_template_and_rejects_a_state_corruption(tmp_path):
    t = get_template("gated_delta_decode.torch_onepass")
    good = tmp_path / "good.py"
    good.write_text(render_candidate([Choice(t, t.default())]))
    r = _check(good)
    assert r.returncode == 0 and "correct:   yes" in r.stdout, r.stdout + r.stderr
    r = _check(BAD)
    assert "correct:   no" in r.stdout and "gated_delta_decode" in r.stdout and "output 1" in r.stdout, r.stdout
