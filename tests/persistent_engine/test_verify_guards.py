"""Run-time guards (global torch state, threads, tensors) and the logits comparison, in this process."""

import threading
import time

import pytest
import torch

from persistent_engine.verification import guards, verify
from persistent_engine.io_struct import WorkloadPoint


def test_global_state_guard_names_and_restores_patches():
    g = guards.GlobalStateGuard(guards.default_namespaces())
    assert g.check() == []
    orig_randn, orig_pc = torch.randn, time.perf_counter_ns
    try:
        torch.randn = lambda *a, **k: torch.zeros(*a)
        time.perf_counter_ns = lambda: 0
        torch.Tensor.normal_ = lambda self, *a, **k: self.zero_()
        torch.set_default_dtype(torch.float64)
        torch.manual_seed(1234)
        changed = g.check()
        for needle in ("torch.randn", "time.perf_counter_ns", "torch.Tensor.normal_", "default_dtype",
                       "global RNG state"):
            assert any(needle in c for c in changed), (needle, changed)
        restored = g.restore()
        assert len(restored) >= 4
        assert g.check() == []
        assert torch.randn is orig_randn and time.perf_counter_ns is orig_pc
        assert "normal_" not in vars(torch.Tensor) and torch.get_default_dtype() == torch.float32
    finally:
        torch.randn, time.perf_counter_ns = orig_randn, orig_pc
        vars(torch.Tensor).get("normal_") and delattr(torch.Tensor, "normal_")
        torch.set_default_dtype(torch.float32)


def test_thread_guard_sees_new_live_threads_only():
    g = guards.ThreadGuard()
    done = threading.Event()
    short = threading.Thread(target=lambda: None)
    short.start()
    short.join()
    assert g.new_threads() == []
    t = threading.Thread(target=done.wait, name="lingering", daemon=True)
    t.start()
    try:
        assert g.new_threads() == ["lingering"]
    finally:
        done.set()
        t.join()
    assert g.new_threads() == []


@pytest.mark.parametrize("budget", [None, 0])       # copies beside the tensors; host copies + fingerprints
def test_tensor_guard_detects_and_restores(budget):
    w = {"a": torch.randn(4, 4), "b": torch.arange(5)}
    orig = {k: t.clone() for k, t in w.items()}
    g = guards.TensorGuard(w, device_budget=budget)
    assert g.on_host == (budget == 0)
    assert g.changed() == []
    w["a"][0, 0] += 1
    w["b"][2] = 9
    assert sorted(g.changed()) == ["a", "b"]
    g.restore(["a"])
    assert g.changed() == ["b"] and torch.equal(w["a"], orig["a"])
    g.restore()
    assert g.changed() == [] and torch.equal(w["b"], orig["b"])


def test_tensor_guard_without_host_room_keeps_no_copies():
    w = {"a": torch.randn(64, 64)}
    g = guards.TensorGuard(w, device_budget=0, host_available=2 * 64 * 64 * 4 - 1)   # half is one byte short
    assert g.on_host and not g.restorable
    w["a"][3, 3] += 1
    assert g.changed() == ["a"]
    with pytest.raises(RuntimeError, match="cannot be restored"):
        g.restore()
    assert guards.TensorGuard(w, device_budget=0, host_available=2 * 64 * 64 * 4).restorable
    avail = guards.host_bytes_available()
    assert avail is None or avail > 0


def test_fingerprint_sees_one_word_a_swap_and_odd_sizes(monkeypatch):
    monkeypatch.setattr(guards, "FINGERPRINT_ROW", 8)            # several rows and chunks on a small tensor
    monkeypatch.setattr(guards, "FINGERPRINT_CHUNK", 32)
    t = torch.randn(13, 9).to(torch.bfloat16)                    # 234 bytes: not a multiple of 4
    fp = guards.fingerprint(t)
    assert torch.equal(guards.fingerprint(t.clone()), fp)
    for i in range(t.numel()):                                   # every single element
        u = t.clone().reshape(-1)
        u[i] = -u[i] if u[i] != 0 else 1.0
        assert not torch.equal(guards.fingerprint(u.reshape(13, 9)), fp), i
    rows = t.clone()
    rows[[0, 5]] = rows[[5, 0]]                                  # two rows swapped
    assert not torch.equal(guards.fingerprint(rows), fp)
    big = torch.arange(100, dtype=torch.int32)
    moved = torch.cat([big[32:64], big[:32], big[64:]])          # two whole chunks swapped
    assert not torch.equal(guards.fingerprint(moved), guards.fingerprint(big))


def test_compare_logits_reasons():
    ref = torch.randn(3, 50)
    assert verify.compare_logits(ref + 1e-4, ref, torch.bfloat16, "p") is None
    assert "relative error" in verify.compare_logits(torch.zeros_like(ref), ref, torch.bfloat16, "p")
    assert "NaN" in verify.compare_logits(ref.clone().fill_(float("nan")), ref, torch.bfloat16, "p")
    assert "shape" in verify.compare_logits(ref[:2], ref, torch.bfloat16, "p")
    assert "dtype" in verify.compare_logits(ref.double(), ref, torch.bfloat16, "p")
    assert "not a tensor" in verify.compare_logits((ref,), ref, torch.bfloat16, "p")


def test_an_engine_without_weight_copies_leaves_after_a_weight_change():
    """Weights too large for host copies (a deepseek tier): a changed weight is named, and the engine
    leaves after the reply instead of restoring (the supervisor starts a fresh one)."""
    from persistent_engine.judge import engine as eng

    e = eng.Engine(eng.EngineConfig(model="tiny-dense", layers=[0], variants=1,
                                    points=[WorkloadPoint(phase="decode", batch=2, context=8, chunk=1, weight=1.0)]))
    weights = guards.model_weights(e.model)
    e.weight_guard = guards.TensorGuard(weights, device_budget=0, host_available=0)
    assert e.weight_guard.on_host and not e.weight_guard.restorable and e._guard_reasons("bench") == []
    name = next(iter(weights))
    with torch.no_grad():
        weights[name].add_(1)
    reasons = e._guard_reasons("bench")
    assert any(f"candidate changed the weights: {name}" in r for r in reasons), reasons
    assert e.poisoned and "no copy was kept" in e.poison_cause
