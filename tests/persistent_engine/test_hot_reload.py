"""Hot reload on one engine process: correct candidates pass, each cheat is rejected with its own
reason, and the same engine (same pid, no rebuild) serves the next candidate afterwards."""

import pathlib

import pytest

from persistent_engine import io_struct as io
from persistent_engine.supervisor import Supervisor

HERE = pathlib.Path(__file__).parent / "candidates"


def src(name: str) -> str:
    return (HERE / f"{name}.py").read_text()


@pytest.fixture(scope="module")
def sup():
    s = Supervisor("tiny-dense", device="cpu", start_timeout_s=300)
    s.start()
    yield s
    s.close()


def _assert_serves_next(sup, pid):
    v = sup.evaluate(src("good_torch"), timeout_s=120)
    assert v.correct, v.reasons
    assert not v.restarted and sup.proc.pid == pid


def test_correct_torch_candidate_passes_with_a_speedup(sup):
    v = sup.evaluate(src("good_torch"), timeout_s=120)
    assert v.correct and v.reasons == [], v.reasons
    assert isinstance(v.speedup, float) and v.speedup > 0      # noise on a shared CPU: no bound
    assert len(v.per_point) == 3 and all(p.affected for p in v.per_point)
    for p in v.per_point:
        assert p.baseline_ms > 0 and p.candidate_ms > 0 and p.baseline_iqr_ms >= 0
    assert {"load_s", "verify_s", "bench_s", "unload_s", "total_s"} <= set(v.timings)
    assert not v.restarted


def test_correct_triton_candidate_passes_under_the_interpreter_and_is_not_timed_there(sup):
    """Issue 46: verified, but its interpreted time is no speedup: not timed on CPU, and said why."""
    v = sup.evaluate(src("good_triton"), timeout_s=300, samples=2)
    assert v.correct, v.reasons
    assert v.speedup is None and v.per_point == [] and "bench_s" not in v.timings
    assert "interpreter on CPU" in v.untimed and v.to_dict()["untimed"] == v.untimed


def test_interpreter_bf16_nan_is_no_rejection_on_cpu_and_the_verdict_says_so(sup):
    """Issue 46: the judge saw NaN in the interpreter's bf16 at op level and fp32 pass (the bf16 slice's
    logits are garbage there): correct, untimed, and said; the same kernel without its weight is rejected on
    its fp32 mismatch."""
    v = sup.evaluate(src("triton_native_add"), timeout_s=300)
    assert v.correct, v.reasons
    assert v.speedup is None and "interpreter on CPU" in v.untimed
    assert any("bf16 checked in fp32" in n for n in v.notes), v.notes
    assert any(n.startswith("layer-level: the bf16 slice's logits") for n in v.notes), v.notes
    v = sup.evaluate(src("triton_native_add_wrong"), timeout_s=300)
    assert not v.correct and v.notes == [] and any("fp32" in r and "mismatch" in r for r in v.reasons), v.reasons


def test_only_triton_sources_on_cpu_go_untimed():
    from compiler.search.acceptance import AcceptanceConfig, screen
    from persistent_engine.supervisor import CandidateVerdict, interpreted_triton

    assert interpreted_triton(src("good_triton"), "cpu") and not interpreted_triton(src("good_triton"), "cuda")
    assert not interpreted_triton(src("good_torch"), "cpu")
    assert interpreted_triton("import triton\n\n@triton.autotune(configs=[], key=[])\n@triton.jit\ndef k(x): pass\n", "cpu")
    assert not interpreted_triton("import torch\nimport triton\nimport triton.language as tl\n", "cpu")
    d = screen(CandidateVerdict(True, [], None, untimed=interpreted_triton(src("good_triton"), "cpu")), 0.02,
               AcceptanceConfig(), "fast")
    assert not d.accepted and "Triton's interpreter" in d.reason


CHEATS = [
    ("cached_outputs", "op-level: rms_norm", "mismatch"),
    ("mutates_inputs", "op-level: rms_norm", "modified input: argument 0"),
    ("mutates_weights", "op-level: fused_add_rms_norm", "modified input: argument 2"),
    ("returns_empty", "op-level: rms_norm", ""),
    ("one_shape", "op-level: rms_norm", "mismatch"),
    ("timed_differs", "spot re-check", "logits differ"),
    ("patches_timer", "candidate changed global state", "time.perf_counter"),
    ("rng_zeros", "load: candidate changed global state", "torch.randn"),
    ("wrong_dtype", "op-level: rms_norm", "dtype: torch.float32, expected torch.bfloat16"),
    ("unknown_op", "static: OVERRIDES names unknown op 'rms_normalize'", ""),
    ("wrong_signature", "static: signature of rms_norm override (x, weight)", ""),
    ("abort_import_os", "static: forbidden import 'os'", ""),
    ("exits", "candidate raised SystemExit", ""),
]


@pytest.mark.parametrize("name, reason, detail", CHEATS, ids=[c[0] for c in CHEATS])
def test_cheat_is_rejected_with_its_reason_and_the_engine_serves_on(sup, name, reason, detail):
    pid = sup.proc.pid
    v = sup.evaluate(src(name), timeout_s=120)
    assert not v.correct
    hit = [r for r in v.reasons if reason in r and detail in r]
    assert hit, v.reasons
    assert not v.restarted and sup.proc.pid == pid
    _assert_serves_next(sup, pid)


def test_returns_empty_is_caught_by_poison_or_determinism(sup):
    v = sup.evaluate(src("returns_empty"), timeout_s=120)
    assert any(k in r for r in v.reasons for k in ("nondeterministic", "non-finite", "mismatch"))


def test_a_slow_candidate_that_patches_the_clocks_is_timed_slow(sup):
    """Even when benched after its rejection, the clocks it patched do not reach the engine's timer."""
    c = sup.client
    assert c.load_candidate(src("patches_timer")).ok      # it patches on its first call, not at import
    v = c.verify()
    assert not v.ok and any("time.perf_counter_ns" in r for r in v.reasons)
    b = c.bench(samples=5)
    assert any("changed global state" in r for r in b.reasons)
    assert b.speedup is not None and b.speedup < 0.8, b.per_point
    assert all(p.candidate_ms > p.baseline_ms for p in b.per_point)
    r = c.unload()
    assert r.ok
    _assert_serves_next(sup, sup.proc.pid)


def test_a_correct_loser_is_stopped_for_futility_and_rechecked(sup):
    """Default samples: every point the slow candidate runs at stops for futility before the sequential stop
    could (6 pairs, or a later look when the shared CPU's noise put a pair within the margin), its speedup
    the median of those pairs (< 0.98), spot re-checks passed, and the compiler's screen rejects it."""
    from compiler.search.acceptance import AcceptanceConfig, screen
    from persistent_engine.measure import timing

    v = sup.evaluate(src("slow_exact"), timeout_s=300)
    assert v.correct, v.reasons
    timed = [p for p in v.per_point if p.affected]
    assert timed and all(p.stopped == "futility" and timing.FUTILITY_MIN_PAIRS <= p.samples < timing.STOP_MIN_PAIRS
                         and p.speedup < 1 / (1 + timing.FUTILITY_MARGIN) for p in timed), v.per_point
    assert all(p.candidate_ms > p.baseline_ms and p.speedup_q1 is not None for p in timed)
    assert v.speedup is not None and v.speedup < 0.98
    assert not screen(v, 0.0, AcceptanceConfig(), "fast").accepted


def test_reload_keeps_the_engine_and_restores_state(sup):
    c = sup.client
    before = c.status()
    r1 = c.load_candidate(src("good_torch"), name="first")
    assert r1.ok and r1.ops == ["fused_add_rms_norm"] and r1.config == {"cuda_graph": True}
    assert r1.description.startswith("fused_add_rms_norm")
    r2 = c.load_candidate(src("one_shape"), name="second")     # replaces the first
    assert r2.ok and c.status().candidate == "second"
    assert not c.verify().ok
    u = c.unload()
    assert u.ok and "candidate second" in u.restored
    after = c.status()
    assert after.candidate is None and after.pid == before.pid and after.startup == before.startup
    assert after.served > before.served
    for req in (c.verify, c.bench):
        e = req()
        assert isinstance(e, io.ErrorReply) and e.kind == "no_candidate"


def test_profile_gives_per_op_time_at_each_point(sup):
    prof = sup.profile()
    assert len(prof["per_point"]) == 3
    for p in prof["per_point"]:
        ops = p["ops"]
        assert {"embedding", "fused_add_rms_norm", "linear", "lm_head"} <= set(ops)
        assert all(o["ms"] >= 0 and o["calls"] >= 1 for o in ops.values())
        assert abs(sum(o["share"] for o in ops.values()) - 1.0) < 1e-6
        assert p["total_ms"] > 0 and p["step_ms"] > 0
    phases = {p["point"]["phase"]: p["ops"] for p in prof["per_point"]}
    assert "attention_decode" in phases["decode"] and "attention_prefill" in phases["prefill"]


@pytest.mark.gpu
def test_on_cuda_graphs_events_and_cheats():
    """The CUDA path: every point (prefill too) timed by CUDA events around graph replays;
    a Triton candidate compiles and passes; a cheat is still caught by the spot re-check or the
    contract; the engine keeps serving."""
    s = Supervisor("tiny-dense", layers=[0, 1], device="cuda", start_timeout_s=600)
    try:
        s.start()
        v = s.evaluate(src("good_torch"), timeout_s=300)
        assert v.correct, v.reasons
        assert v.per_point and all(p.graph for p in v.per_point), v.per_point
        b = s.client
        assert b.load_candidate(src("good_triton")).ok and b.verify().ok
        r = b.bench(samples=10)
        assert r.ok and r.timer == "judge_wall_clock", r.reasons
        assert all(p.graph for p in r.per_point), r.per_point
        assert b.unload().ok, s._stderr_tail(4000)
        for name in ("cached_outputs", "returns_empty", "mutates_weights", "patches_timer"):
            bad = s.evaluate(src(name), timeout_s=300)
            assert not bad.correct and not bad.restarted, (name, bad.reasons)
        assert s.evaluate(src("good_torch"), timeout_s=300).correct
    finally:
        s.close()
