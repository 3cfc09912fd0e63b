"""Issue 20's forgeries against the judge/executor split, on a real judge process with sandboxed executors:
class-method replacement at import, frame walking to loosen tolerances, patching unwatched torch functions so
comparisons read zero, a raw ``_thread`` stealing time while the baseline is timed, outputs cached once timed,
each with obfuscated imports. A wrong one is rejected with its reason; an exact one is timed within the
noise; the judge (same process) judges the next candidate correctly on a fresh executor."""

import pathlib

import pytest

from persistent_engine.supervisor import Supervisor

HERE = pathlib.Path(__file__).parent / "candidates"


def src(name: str) -> str:
    if name.endswith("_late"):                  # the same patches on the first call (past the load guard)
        return src(name[:-5]).replace("LATE = False", "LATE = True")
    return (HERE / f"{name}.py").read_text()


@pytest.fixture(scope="module")
def sup():
    s = Supervisor("tiny-dense", device="cpu", start_timeout_s=300)
    s.start()
    yield s
    s.close()


def _next_is_judged_correctly(sup, pid, used):
    v = sup.evaluate(src("good_torch"), timeout_s=120)
    assert v.correct and not v.restarted and sup.proc.pid == pid, v.reasons
    st = sup.status()
    assert st.executors_used == used + 2 and st.candidate is None


WRONG = [
    ("replaces_judge_methods", "load: candidate changed global state", "persistent_engine.verification.verify.compare_logits"),
    ("replaces_judge_methods_late", "op-level: fused_add_rms_norm", "mismatch"),
    ("walks_frames", "op-level: fused_add_rms_norm", "mismatch"),
    ("patches_unwatched", "op-level: fused_add_rms_norm", "mismatch"),
    ("caches_when_timed", "spot re-check", "logits differ from the reference"),
]


@pytest.mark.parametrize("name, reason, detail", WRONG, ids=[w[0] for w in WRONG])
def test_a_wrong_forger_is_rejected_for_being_wrong_and_the_next_is_judged_correctly(sup, name, reason, detail):
    pid, used = sup.proc.pid, sup.status().executors_used
    v = sup.evaluate(src(name), timeout_s=180, samples=6 if name == "caches_when_timed" else None)
    assert not v.correct and not v.restarted
    assert any(reason in r and detail in r for r in v.reasons), v.reasons
    _next_is_judged_correctly(sup, pid, used)


def test_the_judges_own_tolerances_are_untouched_by_frame_walking(sup):
    before = sup.status()
    sup.evaluate(src("walks_frames"), timeout_s=180)
    after = sup.status()
    assert after.logit_tol == before.logit_tol and max(max(r) for r in after.logit_tol) < 1.0


def test_raw_thread_time_stealing_gains_nothing(sup):
    """An exact kernel whose raw thread burns the CPU whenever its own override is idle (the baseline's
    samples): its side is SIGSTOPped while the baseline is timed, so its speedup stays that of an exact
    kernel (the old in-process engine scored it 6.4x); its own guard still names the thread."""
    c = sup.client
    honest = sup.evaluate(src("good_torch"), timeout_s=180, samples=15)
    assert honest.correct
    c.prepare(timeout_s=300)
    load = c.load_candidate(src("steals_time"), timeout_s=120)
    assert not load.ok and any("native thread" in r for r in load.reasons), load.reasons   # its guard saw it
    c.unload(timeout_s=60)
    # timed anyway (as if that self-report had been forged away): load with the thread started on first call
    c.prepare(timeout_s=300)
    assert c.load_candidate(src("steals_time").replace("\n_start(_burn, ())\n", "\n"
                                                       ).replace("    _last[0] = time.perf_counter()\n",
                                                                 "    _last[0] = time.perf_counter()\n"
                                                                 "    _go()\n").replace(
        "def fused_add_rms_norm", "def _go():\n    if not _started:\n        _started.append(_start(_burn, ()))\n\n\n"
        "_started = []\n\n\ndef fused_add_rms_norm"), timeout_s=120).ok
    c.verify(timeout_s=120)
    b = c.bench(samples=15, timeout_s=180)
    c.unload(timeout_s=60)
    assert b.speedup is not None and b.speedup < 1.6, b.per_point
    # within the measured noise of the A/B: each point's speedup inside the spread of its two sides
    for p in b.per_point:
        spread = (p.baseline_iqr_ms + p.candidate_iqr_ms) / p.baseline_ms
        assert p.speedup < 1.0 + max(0.3, 2 * spread), p
    assert any("native thread" in r for r in b.reasons), b.reasons
    _next_is_judged_correctly(sup, sup.proc.pid, sup.status().executors_used - 1)


def test_exact_but_hostile_patcher_is_rejected_by_its_own_guard_and_timed_honestly(sup):
    """Exact outputs, patches the verification classes in its own process: the judge's comparisons pass,
    the executor's self-report (which can only reject) names the patches, the speedup is an exact kernel's."""
    exact = src("replaces_judge_methods").replace("(r * weight.float())",
                                                  "(r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) "
                                                  "* weight.float())")
    v = sup.evaluate(exact, timeout_s=180)
    assert not v.correct
    assert any("candidate changed global state" in r and "compare_logits" in r for r in v.reasons), v.reasons
    assert not any("mismatch" in r or "logits differ" in r for r in v.reasons), v.reasons
