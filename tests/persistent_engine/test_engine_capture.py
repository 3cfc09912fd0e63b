"""Capturable references (no host reads: they run on shape-only meta tensors), the CUDA-graph
decision logic, the CONFIG knobs and the "kernel ran" / roofline guards, on CPU in this process."""

import pathlib

import pytest
import torch

from persistent_engine.judge import engine as eng
from persistent_engine import io_struct as io
from persistent_engine.measure import timing
from persistent_engine.verification import guards
from persistent_engine.inputs.workloads import relayout_workload
from persistent_engine.ops import attention, moe
from persistent_engine.io_struct import WorkloadPoint

HERE = pathlib.Path(__file__).parent / "candidates"


# ----------------------------------------------------------------------------- capturable references
def test_attention_prefill_reads_nothing_on_the_host():
    m = lambda *s, dt=torch.bfloat16: torch.empty(*s, device="meta", dtype=dt)  # noqa: E731
    out = attention.attention_prefill(m(10, 4, 8), m(20, 4, 2, 8), m(20, 4, 2, 8), m(2, 5, dt=torch.int32),
                                      m(3, dt=torch.int32), m(2, dt=torch.int32), 0.3)
    assert out.shape == (10, 4, 8) and out.dtype == torch.bfloat16


def _unpaged_prefill(q, kc, vc, bt, cu, cl, scale):
    bs, outs = kc.shape[1], []
    for b in range(bt.shape[0]):
        n, length = int(cu[b + 1] - cu[b]), int(cl[b])
        k = torch.cat([kc[int(bt[b, j // bs]), j % bs][None] for j in range(length)])
        v = torch.cat([vc[int(bt[b, j // bs]), j % bs][None] for j in range(length)])
        g = q.shape[1] // k.shape[1]
        qs = q[int(cu[b]):int(cu[b + 1])].transpose(0, 1)                          # [Hq, n, Dh]
        mask = torch.arange(length)[None, :] <= torch.arange(length - n, length)[:, None]
        outs.append(torch.nn.functional.scaled_dot_product_attention(
            qs, k.transpose(0, 1).repeat_interleave(g, 0), v.transpose(0, 1).repeat_interleave(g, 0),
            attn_mask=mask, scale=scale).transpose(0, 1))
    return torch.cat(outs)


@pytest.mark.parametrize("budget", [attention.PREFILL_SCORE_BUDGET, 40])   # 40: one query per chunk
def test_attention_prefill_ragged_chunks_match_the_unpaged_formulation(monkeypatch, budget):
    monkeypatch.setattr(attention, "PREFILL_SCORE_BUDGET", budget)
    g = torch.Generator().manual_seed(3)
    hq, hk, dh, bs = 4, 2, 8, 4
    cu = torch.tensor([0, 3, 10, 11], dtype=torch.int32)          # 3, 7 and 1 new tokens
    cl = torch.tensor([9, 7, 14], dtype=torch.int32)
    bt = torch.randperm(12, generator=g).view(3, 4).to(torch.int32)
    kc, vc = torch.randn(12, bs, hk, dh, generator=g, dtype=torch.float64), torch.randn(12, bs, hk, dh, generator=g, dtype=torch.float64)
    q = torch.randn(11, hq, dh, generator=g, dtype=torch.float64)
    out = attention.attention_prefill(q, kc, vc, bt, cu, cl, 0.35)
    assert torch.allclose(out, _unpaged_prefill(q, kc, vc, bt, cu, cl, 0.35), atol=1e-10)
    strided = torch.randn(11, hq + 2 * hk, dh, dtype=torch.float64)[:, :hq]     # a q/k/v split view
    strided.copy_(q)
    assert torch.allclose(attention.attention_prefill(strided, kc, vc, bt, cu, cl, 0.35), out, atol=1e-12)


def test_moe_experts_grouped_path_matches_the_loop_and_reads_nothing_on_the_host():
    t, e, k, h, i = moe.LOOP_MIN_TOKENS + 5, 16, 2, 32, 16
    g = torch.Generator().manual_seed(0)
    x = torch.randn(t, h, generator=g).bfloat16()
    w13, w2 = (torch.randn(e, 2 * i, h, generator=g) * h ** -0.5).bfloat16(), (torch.randn(e, h, i, generator=g) * i ** -0.5).bfloat16()
    ids = torch.stack([torch.zeros(t, dtype=torch.long), torch.full((t,), 5)], 1)    # 14 empty groups
    ids[::3, 1] = 11
    w = torch.rand(t, k, generator=g)
    flat = ids.flatten()
    s, order = flat.sort(stable=True)
    grouped = moe._grouped_experts(x[order // k], w13, w2, s, e, moe._silu_gate)
    assert grouped is not None
    assert torch.equal(grouped, moe._looped_experts(x[order // k], w13, w2, s, e, moe._silu_gate))
    assert moe._grouped_experts(x[order // k].double(), w13.double(), w2.double(), s, e, moe._silu_gate) is None
    ref64 = moe.moe_experts(x.double(), w13.double(), w2.double(), w.double(), ids)  # float64: the loop
    assert torch.allclose(moe.moe_experts(x, w13, w2, w, ids).double(), ref64, atol=0.05, rtol=0.05)
    m = lambda *sh, dt=torch.bfloat16: torch.empty(*sh, device="meta", dtype=dt)  # noqa: E731
    assert moe.moe_experts(m(t, h), m(e, 2 * i, h), m(e, h, i), m(t, k, dt=torch.float32),
                           m(t, k, dt=torch.long)).shape == (t, h)


# ----------------------------------------------------------------------------- graph decisions
def test_graph_plan_per_point():
    pts = [WorkloadPoint(phase="decode", batch=1), WorkloadPoint(phase="prefill", batch=4)]
    assert timing.graph_plan(pts, "cuda", True) == [None, None]                 # prefill is captured too
    assert timing.graph_plan(pts, "cuda", True, [4]) == ["batch 1 not in cuda_graph_batch_sizes", None]
    assert timing.graph_plan(pts, "cuda", False) == ["CUDA graphs off"] * 2
    assert all(timing.graph_plan(pts, "cpu", True))


def test_capture_points_falls_back_per_point_and_stops_when_the_device_is_unusable():
    def capture(i):
        if i == 1:
            try:
                raise RuntimeError("operation not permitted when stream is capturing")
            except RuntimeError:
                raise RuntimeError("capture_end: invalidated") from None
        return [("graph", i)]
    recovered, errors, lines = [], {}, []
    graphs, healthy = timing.capture_points([0, 1, 2], capture, lambda: recovered.append(1) or True, errors,
                                            lines.append)
    assert healthy and graphs == {0: [("graph", 0)], 1: None, 2: [("graph", 2)]} and recovered == [1]
    assert "invalidated (during RuntimeError: operation not permitted" in errors[1] and list(errors) == [1] and lines
    errors = {}
    graphs, healthy = timing.capture_points([1, 0], capture, lambda: False, errors)
    assert not healthy and graphs == {1: None, 0: None} and "unusable" in errors[0]
    try:
        try:
            raise ValueError("tolist during capture")
        except ValueError:
            raise RuntimeError("capture_end failed")
    except RuntimeError as e:
        assert "during ValueError: tolist during capture" in timing.describe_error(e)


# ----------------------------------------------------------------------------- guards (functions)
def test_never_called_and_roofline_checks():
    c_used, c_idle, c_absent = guards.Counted(abs), guards.Counted(abs), guards.Counted(abs)
    c_used(1)
    ops_at = [{"linear", "rms_norm"}, {"linear"}]
    reasons = guards.never_called({"linear": c_used, "rms_norm": c_idle, "mla_decode": c_absent}, ops_at)
    assert reasons == ["layer-level: override mla_decode never called: the model does not call mla_decode at any "
                       "workload point",
                       "layer-level: override rms_norm never called: its implementation did not run in any "
                       "layer-level step"]
    assert guards.implausibly_fast("decode b1", 0.5, 0.25) is None
    assert guards.implausibly_fast("decode b1", 0.1, 0.25) == "timing: implausibly fast at decode b1: 0.1 ms < floor 0.25 ms"
    assert guards.implausibly_fast("p", 0.0, 0.0) is None                          # floor off


# ----------------------------------------------------------------------------- the engine, in process
@pytest.fixture(scope="module")
def engine():
    threads, grad = torch.get_num_threads(), torch.is_grad_enabled()
    e = eng.Engine(eng.EngineConfig(model="tiny-dense", layers=[0, 1], variants=1))
    yield e
    torch.set_num_threads(threads)
    torch.set_grad_enabled(grad)


def _cycle(e, source, samples=3):
    load = e.handle(io.LoadCandidate(source=source))
    ver = e.handle(io.Verify()) if load.ok else None
    bench = e.handle(io.Bench(samples=samples)) if ver is not None and ver.ok else None
    e.handle(io.Unload())
    return load, ver, bench


GOOD = (HERE / "good_torch.py").read_text()


def test_min_step_bytes_counts_weights_and_the_kv_read(engine):
    w = engine.workloads[2][0]                       # prefill 16 tokens, no cached prefix
    weights = sum(t.numel() * t.element_size() for n, t in guards.model_weights(engine.model).items()
                  if "embed" not in n and n != "cos_sin")
    kv = engine.spec.num_kv_heads * engine.spec.head_dim * 2 * 2 * 2 * 16   # K+V, bf16, 2 layers, 16 tokens
    assert guards.min_step_bytes(guards.model_weights(engine.model), w, engine.spec) == weights + kv
    assert engine.floor_ms == [0.0, 0.0, 0.0]         # off on CPU unless configured


def test_override_the_model_never_calls_is_rejected(engine):
    src = ("import torch\n"
           "def mla_v_up(o_latent, w_uv):\n"
           "    return torch.einsum('thl,hvl->thv', o_latent.double(), w_uv.double()).to(o_latent.dtype)\n"
           "OVERRIDES = {'mla_v_up': mla_v_up}\n")
    load, ver, _ = _cycle(engine, src)
    assert load.ok and not ver.ok
    assert ver.reasons == ["layer-level: override mla_v_up never called: the model does not call mla_v_up at "
                           "any workload point"]
    assert _cycle(engine, GOOD)[2].ok


def test_roofline_floor_rejects_a_step_faster_than_the_bandwidth_allows(engine, monkeypatch):
    monkeypatch.setattr(engine, "floor_ms", [1e6, 0.0, 0.0])       # a 1000 s floor at the first point
    _, ver, bench = _cycle(engine, GOOD)
    assert ver.ok and not bench.ok
    assert len(bench.reasons) == 1 and bench.reasons[0].startswith("timing: implausibly fast at decode b1 ctx24:")
    assert bench.per_point[0].floor_ms == 1e6


def test_kv_block_size_relays_the_candidate_cache_and_restores_it(engine):
    before = [w.cache.block_size for ws in engine.workloads for w in ws]
    relaid = relayout_workload(engine.model, engine.workloads[1][0], 4, seed=5)
    assert relaid.cache.block_size == 4 and relaid.block_tables.shape[1] == 4 * engine.workloads[1][0].block_tables.shape[1]
    assert torch.allclose(engine.model.step(relaid), engine.ref[1][0], atol=0.05, rtol=0.05)
    src = GOOD.replace('CONFIG = {"cuda_graph": True}', 'CONFIG = {"kv_block_size": 4, "max_num_seqs": 8}')
    load, ver, bench = _cycle(engine, src)
    assert load.ok and "kv_block_size: applied" in load.message
    assert "max_num_seqs: not measurable by the engine; judged by compiler config search" in load.message
    assert ver.ok, ver.reasons
    assert bench.ok and all(p.affected for p in bench.per_point)
    assert bench.per_point[0].config["max_num_seqs"].startswith("not measurable")
    assert engine.cand_workloads is None and [w.cache.block_size for ws in engine.workloads for w in ws] == before
    bad = GOOD.replace('CONFIG = {"cuda_graph": True}', 'CONFIG = {"kv_block_size": 0}')
    load = engine.handle(io.LoadCandidate(source=bad))
    assert not load.ok and load.reasons == ["load: CONFIG['kv_block_size'] = 0 is outside 1..4096"]
    assert engine.candidate is None


def test_graph_knobs_reach_the_bench_reply(engine):
    src = GOOD.replace('CONFIG = {"cuda_graph": True}', 'CONFIG = {"cuda_graph_batch_sizes": [1]}')
    _, _, bench = _cycle(engine, src)
    assert bench.ok and all(p.graph is False and p.graph_error == "cpu: no CUDA graphs"
                            for p in bench.per_point)
    assert "cuda_graph_batch_sizes: applied" in bench.message
