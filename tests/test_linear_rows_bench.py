"""benchmarks/linear_rows.py at toy shapes on CPU (Triton interpreted): every variant matches the fp32 product, a
wrong setting is refused with its reason, the JSON holds each row count's best template against cuBLAS, and a bad
argument is one line and exit 2."""

import importlib.util
import json
import os
import pathlib

BENCH = pathlib.Path(__file__).parents[1] / "benchmarks" / "linear_rows.py"


def _bench():
    spec = importlib.util.spec_from_file_location("linear_rows", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_tiny_run_times_each_variant_and_writes_rows(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", os.environ.get("TRITON_INTERPRET", "1"))
    bench, out = _bench(), tmp_path / "rows.json"
    args = ["--device", "cpu", "--model", "tiny-dense", "--shapes", "o,down", "--rows", "1,17", "--configs", "2",
            "--steps", "2", "--samples", "2", "--pick-samples", "1", "--out", str(out)]
    assert bench.main(args) == 0
    doc = json.loads(out.read_text())
    assert [(r["shape"], r["rows"]) for r in doc["rows"]] == [("o", 1), ("o", 17), ("down", 1), ("down", 17)]
    for r in doc["rows"]:
        assert set(r["variants"]) == ({"cublas", "gemv", "skinny"} if r["rows"] == 1 else {"cublas", "skinny"})
        for v in r["variants"].values():
            assert v["timing"]["back_to_back_ms"] > 0 and v["timing"]["one_replay_ms"] > 0
            assert v["gbs"] > 0 and v["vs_cublas_one_replay"] > 0
        assert r["variants"]["skinny"]["tried"] == 2 and not r["variants"]["skinny"]["rejected"]
    assert set(doc["summary"]) == {"1", "17"} and all(v > 0 for v in doc["summary"].values())
    assert doc["torch"] and "date" in doc and "timer" in doc


def test_a_setting_the_template_refuses_is_not_timed(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", os.environ.get("TRITON_INTERPRET", "1"))
    bench = _bench()
    fn, problems = bench.template_impl("linear.triton_skinny", {"SKINNY_SPLIT_K": 1, "SKINNY_FUSED_REDUCE": 1})
    assert fn is None and any("FUSED_REDUCE" in p for p in problems)
    few, many = bench.skinny_settings(8, 99), bench.skinny_settings(256, 99)   # 8 rows: every row tile is 16
    keys = [(16, *(v for k, v in s.items() if k != "SKINNY_BLOCK_T")) for s in few]
    assert len(keys) == len(set(keys)) and len(few) < len(many) == len(bench.SKINNY_CONFIGS)


def test_bad_arguments_are_one_line_and_exit_2(capsys):
    bench = _bench()
    assert bench.main(["--device", "cpu", "--rows", "0"]) == 2
    assert bench.main(["--device", "cpu", "--model", "tiny-dense", "--shapes", "qkv,nope"]) == 2
    assert bench.main(["--device", "cpu", "--model", "no-such-model"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("linear_rows: error:") for line in err)


def test_every_setting_the_bench_tries_is_one_its_template_accepts():
    """A setting outside the template's knob choices would be refused on the GPU and never timed (an H100 run
    lost one of the skinny GEMM's twelve that way); the GEMV's row block grows with the rows up to its 4."""
    from agents.templates import get_template

    bench = _bench()
    for name, settings in (("linear.triton_skinny", bench.skinny_settings(256, 99)),
                           ("linear.triton_gemv_splitk", bench.gemv_settings(16, 99))):
        t = get_template(name)
        assert settings and all(t.check({**t.default(), **s}) == [] for s in settings), name
    assert [bench.gemv_settings(r, 1)[0]["GEMV_BLOCK_M"] for r in (1, 2, 3, 16)] == [1, 2, 4, 4]
    assert bench.gemv_settings(17, 8) == []
