"""benchmarks/verify_tolerance.py on CPU: per tier of a plan, the noise and bound the engine calibrates and
the plan's own error, read back from its JSON; a wrong plan shows an error far above its noise."""

import importlib.util
import json
import sys
from pathlib import Path

from test_e2e_decode_bench import CORRECT, WRONG, write_plan

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "verify_tolerance.py"
spec = importlib.util.spec_from_file_location("verify_tolerance_under_test", SCRIPT)
vt = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = vt
spec.loader.exec_module(vt)


def _run(tmp_path, source: str) -> dict:
    vdir = write_plan(tmp_path / "plan", "rms", source)
    out = tmp_path / "tol.json"
    assert vt.main(["--device", "cpu", "--plan", str(vdir.parent), "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_a_correct_plan_sits_below_the_noise_a_wrong_one_far_above(tmp_path):
    from persistent_engine.verification import tolerance

    good = _run(tmp_path / "good", CORRECT)
    assert good["model"] == "tiny-dense" and good["noise_factor"] == tolerance.NOISE_FACTOR
    assert [(r["tier"], r["layers"]) for r in good["rows"]] == [("fast", [0])] * 2 + [("slow", [0, 1])] * 2
    for r in good["rows"]:
        assert r["point"] == "decode b2 ctx24" and 0 < r["noise"] < 0.5
        assert r["bound"] == tolerance.tolerance(__import__("torch").bfloat16, r["noise"])
        assert r["plan_error"] < r["noise"] and r["plan_error"] < r["bound"]
        assert r["plan_over_noise"] == r["plan_error"] / r["noise"]
    wrong = _run(tmp_path / "wrong", WRONG)
    assert all(r["plan_error"] > r["bound"] and r["plan_over_noise"] > 2 for r in wrong["rows"])


def test_a_missing_plan_is_one_line_and_exit_2(tmp_path, capsys):
    assert vt.main(["--device", "cpu", "--plan", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("verify_tolerance: ") and err.count("\n") == 1
