"""Issue 39: the compiled step as the baseline (``executor/compiled_step.py``), on CPU with inductor's C++
backend. With ``TKCC_COMPILED=1`` both executors run their timed steps under ``torch.compile``, the
candidate's override as an opaque call: an exact override written in eager torch, which ties the eager
reference (~1.0x), loses to the compiled step around it, and the judge says so."""

import pathlib

import pytest

from persistent_engine import COMPILED_ENV, Supervisor, baseline_words, compiled_default

HERE = pathlib.Path(__file__).parent / "candidates"


def test_the_default_and_the_switch(monkeypatch):
    monkeypatch.delenv(COMPILED_ENV, raising=False)
    assert compiled_default("cpu") is False and compiled_default("cuda") is False
    monkeypatch.setenv(COMPILED_ENV, "1")
    assert compiled_default("cpu") is True
    monkeypatch.setenv(COMPILED_ENV, "0")
    assert compiled_default("cuda") is False
    assert "torch.compile" in baseline_words(True) and "eager" in baseline_words(False)


def test_an_eager_override_loses_to_the_compiled_step(monkeypatch):
    monkeypatch.setenv(COMPILED_ENV, "1")
    sup = Supervisor("tiny-dense", device="cpu", start_timeout_s=600)
    try:
        sup.start()
        v = sup.evaluate((HERE / "good_torch.py").read_text(), timeout_s=600, samples=6)
    finally:
        sup.close()
    assert v.correct, v.reasons                           # compiling left no thread or patch a guard blames
    assert v.speedup is not None and v.speedup < 0.85, v.speedup
    assert all(p.baseline_ms < p.candidate_ms for p in v.per_point), [(p.baseline_ms, p.candidate_ms)
                                                                      for p in v.per_point]
