"""scripts/board_verdicts.py names every verdict of an optimize run's board."""

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("board_verdicts", ROOT / "scripts" / "board_verdicts.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _board(tmp_path):
    """A board as an optimize run leaves it: two ideas, their candidates, a rejection and a pass."""
    from bulletin_board import Board

    db = tmp_path / "board.db"
    board = Board(f"sqlite:///{db}")
    run = board.create_run("qwen3-moe", "h200")
    for title, verdict, speedup, reasons in (
            ("attention_decode.triton{BLOCK=64}", "correct", 1.21, ()),
            ("moe_experts.triton_fused", "rejected", None, ("nondeterministic: two runs differ", "second"))):
        idea = board.post_idea(run, "offline-kernel-0", title)
        cand = board.add_candidate(run, "offline-kernel-0", f"# {title}\nOVERRIDES = {{}}\n", idea)
        board.add_evaluation(cand, "fast", None, {"speedup": speedup} if speedup else {}, verdict, reasons)
    board.close()
    return db, run.id


def test_every_evaluation_of_a_board_is_one_line_with_its_reasons(tmp_path):
    db, run = _board(tmp_path)
    lines = _script().verdict_lines(str(db), run=run)
    assert len(lines) == 2 and all(line.startswith(f"run {run} fast ") for line in lines)
    assert " correct " in lines[0] and "1.210x" in lines[0] and "attention_decode" in lines[0]
    assert " rejected " in lines[1] and "nondeterministic: two runs differ; second" in lines[1]


def test_a_missing_board_is_one_line_and_exit_2(capsys):
    assert _script().main(["/nonexistent/board.db"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
