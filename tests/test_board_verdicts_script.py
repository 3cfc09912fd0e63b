"""scripts/board_verdicts.py names every verdict of a committed H200 run's board (examples/plans)."""

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("board_verdicts", ROOT / "scripts" / "board_verdicts.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_evaluation_of_the_qwen3_moe_board_is_one_line_with_its_reasons():
    lines = _script().verdict_lines(str(ROOT / "examples/plans/qwen3-moe-h200/board.db"), run=1)
    assert len(lines) > 10 and all(line.startswith("run 1 ") for line in lines)
    assert any(" rejected " in line and "nondeterministic" in line for line in lines)
    assert any(" correct " in line and "attention_decode" in line for line in lines)


def test_a_missing_board_is_one_line_and_exit_2(capsys):
    assert _script().main(["/nonexistent/board.db"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
