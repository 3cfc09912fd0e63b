"""Issue 39: the compiled step as the baseline (``executor/compiled_step.py``), on CPU with inductor's C++
backend. With ``TKCC_COMPILED=1`` both executors run their timed steps under ``torch.compile``, the
candidate's override as an opaque call: an exact override written in eager torch, which ties the eager
reference (~1.0x), loses to the compiled step around it, and the judge says so."""

import pathlib
import time

from persistent_engine import COMPILED_ENV, Supervisor, baseline_words, compiled_default

HERE = pathlib.Path(__file__).parent / "candidates"


def test_the_default_and_the_switch(monkeypatch):
    monkeypatch.delenv(COMPILED_ENV, raising=False)
    assert compiled_default("cpu") is False and compiled_default("cuda") is True
    monkeypatch.setenv(COMPILED_ENV, "1")
    assert compiled_default("cpu") is True
    monkeypatch.setenv(COMPILED_ENV, "0")
    assert compiled_default("cuda") is False
    assert "torch.compile" in baseline_words(True) and "eager" in baseline_words(False)


def test_an_eager_override_loses_to_the_compiled_step_and_its_op_set_compiles_once(monkeypatch):
    """The candidate's op set is queued behind it: a trusted executor compiles that set's graphs meanwhile
    (executor/compile_cache.py), and the next candidate of the same set is seeded with them."""
    monkeypatch.setenv(COMPILED_ENV, "1")
    source = (HERE / "good_torch.py").read_text()
    again = source + "\n# the same op set, another source\n"
    sup = Supervisor("tiny-dense", device="cpu", start_timeout_s=600)
    try:
        sup.start()
        v = sup.evaluate(source, timeout_s=600, samples=6, queued=[again])
        deadline = time.monotonic() + 300
        while sup.status().compiled_kept < 1 and time.monotonic() < deadline:
            time.sleep(2)
        seeded = sup.evaluate(again, timeout_s=600, samples=4)
        status = sup.status()
    finally:
        sup.close()
    assert v.correct, v.reasons                           # compiling left no thread or patch a guard blames
    assert v.speedup is not None and v.speedup < 0.85, v.speedup
    assert all(p.baseline_ms < p.candidate_ms for p in v.per_point), [(p.baseline_ms, p.candidate_ms)
                                                                      for p in v.per_point]
    assert status.compiled_kept == 1 and status.compiled_seeded == 1, status
    assert seeded.correct and seeded.speedup is not None and seeded.speedup < 0.85, (seeded.reasons, seeded.speedup)
