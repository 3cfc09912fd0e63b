"""The step profile (``measure.step_profile``): a graph replay's kernels attributed to the ops that launched
them, so the agents rank ops by what the captured step spends, not by sync-timed calls. The CPU runs the
same logic with ``aten::`` ops for kernels and an eager step for the replay; the GPU test replays a graph."""

from __future__ import annotations

import pytest
import torch

from persistent_engine.inputs.workloads import make_workload
from persistent_engine.io_struct import WorkloadPoint
from persistent_engine.measure import profiler, step_profile, timing
from persistent_engine.measure.step_profile import OUTSIDE, align, attribute, merge
from persistent_engine.models.decoder import build_model
from persistent_engine.ops import registry

DECODE = WorkloadPoint(phase="decode", batch=2, context=10, chunk=1, weight=1.0)


@pytest.fixture(autouse=True)
def _no_overrides_left():
    yield
    assert registry.active_overrides() == {}


def test_align_matches_the_replay_to_the_eager_kernels_in_order_and_leaves_extra_nodes_unmatched():
    labelled = [("rms", "k_norm"), ("linear", "gemv"), (OUTSIDE, "copy"), ("linear", "gemv"), ("attn", "flash")]
    replay = ["k_norm", "gemv", "memset", "copy", "gemv", "flash"]
    assert align(labelled, replay) == ["rms", "linear", None, OUTSIDE, "linear", "attn"]
    # a kernel the capture dropped: the rest still find their ops
    assert align(labelled, ["k_norm", "gemv", "gemv", "flash"]) == ["rms", "linear", "linear", "attn"]


def test_attribute_gives_each_op_its_kernels_busy_time_and_the_gaps_before_them():
    replay = [("a", 0.0, 10.0), ("b", 12.0, 20.0), ("c", 18.0, 25.0), ("d", 30.0, 31.0)]
    got = attribute(replay, ["x", "y", "y", None])
    assert got["x"] == {"busy_us": 10.0, "idle_us": 0.0, "kernels": 1}
    # y: 8 us + the 5 us of c no earlier kernel covers; the 2 us gap before b
    assert got["y"] == {"busy_us": 13.0, "idle_us": 2.0, "kernels": 2}
    assert got["(unmatched)"] == {"busy_us": 1.0, "idle_us": 5.0, "kernels": 1}
    assert sum(r["busy_us"] + r["idle_us"] for r in got.values()) == 31.0          # the replay's span


def test_merge_takes_the_replay_times_and_keeps_the_sync_figures_beside_them():
    sync_ops = {"linear": {"ms": 2.0, "calls": 4, "share": 0.8}, "rms_norm": {"ms": 0.5, "calls": 2, "share": 0.2}}
    replay = {"matched": 1.0, "span_ms": 0.4, "ops": {
        "linear": {"ms": 0.1, "busy_ms": 0.08, "idle_ms": 0.02, "kernels": 4},
        "rms_norm": {"ms": 0.2, "busy_ms": 0.05, "idle_ms": 0.15, "kernels": 2},
        OUTSIDE: {"ms": 0.1, "busy_ms": 0.1, "idle_ms": 0.0, "kernels": 3}}}
    ops, outside = merge(sync_ops, replay)
    assert list(ops) == ["rms_norm", "linear"]                      # the replay's order, not the sync one
    assert ops["linear"] == {"ms": 0.1, "sync_ms": 2.0, "calls": 4, "share": 0.25, "busy_ms": 0.08, "idle_ms": 0.02,
                             "kernels": 4}
    assert outside == pytest.approx(0.1)
    assert merge(sync_ops, {**replay, "matched": 0.5}) == (sync_ops, 0.0)       # the graph is not the eager step


def test_labelled_kernels_name_each_op_of_a_cpu_step_and_the_glue_between_them():
    torch.manual_seed(0)
    model = build_model("tiny-dense")
    wl = make_workload(model, DECODE, seed=3)
    labelled = step_profile.labelled_kernels(model, wl, torch.device("cpu"))
    ops = {op for op, _ in labelled}
    tree = profiler.call_tree(model, wl)
    # every top-level op that runs kernels of its own is seen, and nothing else but the glue
    assert ops - {OUTSIDE} <= set(tree) and {"attention_decode", "add_rms_norm_linear", "lm_head"} <= ops
    assert all(name.startswith("aten::") for _, name in labelled)
    assert labelled[0][0] == "embedding" and OUTSIDE in ops       # the step's first kernel; the model's own glue


def test_replay_profile_of_a_cpu_step_matches_every_kernel_and_sums_to_the_span():
    torch.manual_seed(0)
    model = build_model("tiny-dense")
    wl = make_workload(model, DECODE, seed=3)
    got = step_profile.replay_profile(model, wl, torch.device("cpu"), steps=3)
    assert got["timed"] == "eager" and got["matched"] == 1.0 and got["kernels"] > 10
    assert "attention_decode" in got["ops"] and got["ops"]["attention_decode"]["kernels"] >= 2
    total = sum(r["ms"] for r in got["ops"].values())
    assert total == pytest.approx(got["span_ms"], rel=0.25)       # medians per op, over 3 steps
    sync_ops = profiler.profile_point(model, wl, torch.device("cpu"), reps=1)
    ops, _ = merge(sync_ops, got)
    assert set(ops) == set(sync_ops) and all("sync_ms" in r for r in ops.values())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_replay_profile_attributes_a_graphs_kernels_and_sums_to_the_replay():
    torch.manual_seed(0)
    device = torch.device("cuda")
    model = build_model("tiny-dense", device=device, dtype=torch.bfloat16)
    wl = make_workload(model, DECODE, seed=3)
    got = step_profile.replay_profile(model, wl, device, steps=5)
    assert got["timed"] == "cuda_graph" and got["matched"] >= step_profile.MIN_MATCHED, got
    total = sum(r["ms"] for r in got["ops"].values())
    assert total == pytest.approx(got["span_ms"], rel=0.2), got
    sync_ops = profiler.profile_point(model, wl, device, reps=2)
    ops, _ = merge(sync_ops, got)
    # the graph replay spends less than the per-op syncs claim (each synced op pays a launch and a sync)
    assert sum(r["ms"] for r in ops.values()) < sum(r["sync_ms"] for r in ops.values()), ops


def _engine_over(model, wl):
    """The judge engine's profile logic over a bare model (no executors)."""
    from persistent_engine.judge.engine import Engine

    e = Engine.__new__(Engine)
    e.model, e.workloads, e.device, e.points = model, [(wl,)], torch.device("cpu"), [DECODE]
    e.workload_guard = type("Guard", (), {"restore": lambda self: None})()
    return e


def test_the_engine_takes_the_replay_times_or_says_why_the_sync_ones_stay(monkeypatch, capsys):
    from persistent_engine.io_struct import PointProfile

    torch.manual_seed(0)
    model = build_model("tiny-dense")
    wl = make_workload(model, DECODE, seed=3)
    engine = _engine_over(model, wl)
    sync_ops = profiler.profile_point(model, wl, torch.device("cpu"), reps=1)
    got = PointProfile(DECODE, "d", 1.0, **engine._replay_profile(0, sync_ops))
    assert got.timed == "cuda_graph" and got.replay_ms > 0 and got.ops["attention_decode"]["sync_ms"] > 0
    assert got.total_ms == pytest.approx(sum(o["ms"] for o in got.ops.values()) + got.outside_ms)

    def refused(*a, **k):
        raise RuntimeError("operation not permitted when stream is capturing")
    monkeypatch.setattr(step_profile, "replay_profile", refused)
    monkeypatch.setattr(timing, "recover_after_capture", lambda device: True)     # the device takes work again
    got = PointProfile(DECODE, "d", 1.0, **engine._replay_profile(0, sync_ops))
    assert got.timed == "sync" and got.ops is sync_ops and "stream is capturing" in got.replay_note
    assert "ops timed per op with syncs (not replayed: RuntimeError" in capsys.readouterr().err
