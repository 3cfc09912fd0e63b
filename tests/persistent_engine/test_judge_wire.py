"""Issue 38: a hostile executor against the judge at the wire level, on a real judge process with sandboxed
executors. The candidate (``candidates/breaks_the_wire.py``) reaches its executor's request loop at import
(frames walked through ``getattr``) and writes the replies itself: half-written frames, a tensor whose data
is an int of 3 GiB, two million empty maps, the mailbox named 64 times over, a truncated mailbox, another
nonce, another kind. Each costs the candidate its verdict; the judge stays the same process, unrestarted,
its peak memory within 2x of what judging an honest candidate took, and judges the next candidate right."""

import pathlib

import pytest

from persistent_engine.supervisor import Supervisor

HERE = pathlib.Path(__file__).parent / "candidates"


def src(name: str) -> str:
    return (HERE / f"{name}.py").read_text()


def attack(mode: str, on: str) -> str:
    return src("breaks_the_wire").replace('MODE = "half_header"', f'MODE = "{mode}"').replace(
        'ON = "loaded"', f'ON = "{on}"')


def peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.fixture(scope="module")
def sup():
    s = Supervisor("tiny-dense", device="cpu", start_timeout_s=300)
    s.start()
    honest = s.evaluate(src("good_torch"), timeout_s=180, samples=4)
    assert honest.correct, honest.reasons
    s.honest_peak = peak_rss(s.proc.pid)
    yield s
    s.close()


ATTACKS = [
    ("half_header", "loaded", "protocol: the executor broke the protocol during load: a frame stalled"),
    ("half_body", "loaded", "protocol: the executor broke the protocol during load: a frame stalled"),
    ("int_data", "op_results", "protocol: the executor broke the protocol during op_checks: tensor data must be"),
    ("many_maps", "loaded", "protocol: the executor broke the protocol during load: a frame of more than"),
    ("box_repeat", "op_results", "protocol: the executor broke the protocol during op_checks: a reply takes more"),
    ("nonce", "loaded", "protocol: the executor broke the protocol during load: a 'loaded' reply with the wrong nonce"),
    ("kind", "loaded", "protocol: the executor broke the protocol during load: expected a 'loaded' reply, got 'ran'"),
    ("shrink", "op_results", "op-level: fused_add_rms_norm"),      # the seal holds: judged on what it sent
]


@pytest.mark.parametrize("mode, on, reason", ATTACKS, ids=[a[0] for a in ATTACKS])
def test_a_hostile_reply_costs_the_candidate_its_verdict_never_the_judge(sup, mode, on, reason):
    pid, used = sup.proc.pid, sup.status().executors_used
    v = sup.evaluate(attack(mode, on), timeout_s=120, samples=4)
    assert not v.correct and not v.restarted, v.reasons
    assert any(r.startswith(reason) for r in v.reasons), v.reasons
    assert sup.proc.pid == pid and sup.alive()
    assert peak_rss(pid) <= 2 * sup.honest_peak, (peak_rss(pid), sup.honest_peak)
    nxt = sup.evaluate(src("good_torch"), timeout_s=180, samples=4)
    assert nxt.correct and not nxt.restarted and sup.proc.pid == pid, nxt.reasons
    assert sup.status().executors_used >= used + 1         # the next one had a fresh executor


def test_an_op_the_source_declares_is_verified_or_the_candidate_rejected(sup):
    """The source decides what is verified: an op its OVERRIDES literal declares that the executor does not
    report (taken out of the load reply), or one the module adds to its live OVERRIDES at import, rejects."""
    hides = src("hides_an_op")
    adds = hides.replace("HIDES = True", "HIDES = False").replace(
        'OVERRIDES = {"fused_add_rms_norm": fused_add_rms_norm, "silu_and_mul": silu_and_mul}',
        'OVERRIDES = {"fused_add_rms_norm": fused_add_rms_norm}\nOVERRIDES["silu_and_mul"] = silu_and_mul')
    assert adds != hides
    for source, reason in ((hides, "load: OVERRIDES declares 'silu_and_mul' but the loaded module does not"),
                           (adds, "load: the loaded module overrides 'silu_and_mul', which the source's")):
        v = sup.evaluate(source, timeout_s=120, samples=4)
        assert not v.correct and not v.restarted and any(r.startswith(reason) for r in v.reasons), v.reasons


@pytest.mark.parametrize("mode, reason", [
    ("wrong", "spot re-check"),                         # the zeros the timed runs left, compared by the judge
    ("lazy", "timed run(s)"),                           # NaN in the judge's ring at the reply
    ("ahead", "protocol:"),                             # a reply ahead of its request: another nonce, kind
])
def test_a_forged_timed_run_is_caught_in_the_judges_own_ring(sup, mode, reason):
    """The candidate swaps its executor's handler of timed runs (``candidates/forges_the_loop.py``): a zeros
    kernel only while timed, or a reply before the work (or ahead of the request). What the judge checks is its
    own copy of the ring taken at the reply, so none is accepted (before the ring: 24-59x)."""
    source = src("forges_the_loop").replace('MODE = "wrong"', f'MODE = "{mode}"')
    v = sup.evaluate(source, timeout_s=180, samples=6)
    assert not v.correct and not v.restarted, (v.reasons, v.speedup)
    assert any(reason in r for r in v.reasons), v.reasons
