"""An executor that dies says why: ``ExecutorDied`` carries how it ended and the last lines of its stderr
(a start-up failure on a GPU box once read only "ExecutorDied: exit code 1")."""

import torch

from persistent_engine.executor import launch
from persistent_engine.executor.channel import Arena
from persistent_engine.executor.launch import Executor, ExecutorDied


def test_an_executor_that_fails_at_start_up_reports_its_stderr(tmp_path):
    arena = Arena.build({"weight.x": torch.zeros(4)})
    init = {"model": "no-such-model", "layers": [0], "device": "cpu", "dtype": "float32", "points": [],
            "variants": 1, "seed": 0, "threads": 1, "capture": False}
    ex = Executor(init, arena, str(tmp_path))
    try:
        ex.wait_ready(120)
        raise AssertionError("an executor of an unknown model started")
    except ExecutorDied as e:
        assert e.how == "exit code 1", e
        assert "no-such-model" in e.tail and "Traceback" in e.tail, e.tail   # the worker's own traceback
        assert "its stderr ended:" in str(e) and e.tail in str(e)
        assert len(e.tail.split(" | ")) <= launch.STDERR_TAIL_LINES
    finally:
        ex.kill()


def test_the_tail_is_the_last_lines_and_bounded(tmp_path):
    ex = Executor.__new__(Executor)
    ex.stderr_path = str(tmp_path / "e.stderr")
    (tmp_path / "e.stderr").write_text("".join(f"line {n}\n\n" for n in range(100)) + "x" * 10_000)
    tail = ex.stderr_tail()
    assert len(tail) <= launch.STDERR_TAIL_CHARS and tail.endswith("x" * 100)
    (tmp_path / "e.stderr").write_text("".join(f"line {n}\n\n" for n in range(100)))
    assert ex.stderr_tail(3) == "line 97 | line 98 | line 99"       # blank lines skipped
    assert ex.stderr_tail().startswith(f"line {100 - launch.STDERR_TAIL_LINES} | ")
    ex.stderr_path = str(tmp_path / "missing")
    assert ex.stderr_tail() == ""
