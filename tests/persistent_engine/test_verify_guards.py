"""Run-time guards (global torch state, threads, tensors) and the logits comparison, in this process."""

import threading
import time

import torch

from persistent_engine import guards, verify


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


def test_tensor_guard_detects_and_restores():
    w = {"a": torch.randn(4, 4), "b": torch.arange(5)}
    g = guards.TensorGuard(w)
    assert g.changed() == []
    w["a"][0, 0] += 1
    w["b"][2] = 9
    assert sorted(g.changed()) == ["a", "b"]
    g.restore(["a"])
    assert g.changed() == ["b"]
    g.restore()
    assert g.changed() == []


def test_compare_logits_reasons():
    ref = torch.randn(3, 50)
    assert verify.compare_logits(ref + 1e-4, ref, torch.bfloat16, "p") is None
    assert "relative error" in verify.compare_logits(torch.zeros_like(ref), ref, torch.bfloat16, "p")
    assert "NaN" in verify.compare_logits(ref.clone().fill_(float("nan")), ref, torch.bfloat16, "p")
    assert "shape" in verify.compare_logits(ref[:2], ref, torch.bfloat16, "p")
    assert "dtype" in verify.compare_logits(ref.double(), ref, torch.bfloat16, "p")
    assert "not a tensor" in verify.compare_logits((ref,), ref, torch.bfloat16, "p")
