import operator

import pytest
import torch

from persistent_engine.models.decoder import build_model
from persistent_engine.models.kv_cache import alloc_kv_cache, kv_write, write_kv
from persistent_engine.models.spec import ModelSpec
from persistent_engine.serving.engine import compiled_decode
from persistent_engine.inputs.workloads import make_workload
from persistent_engine.io_struct import WorkloadPoint


def test_gqa_and_mla_pools_match_the_spec_accounting():
    dense = ModelSpec.from_name("tiny-dense")
    c = alloc_kv_cache(dense, [0, 1], batch=3, tokens_per_seq=40, block_size=16)
    assert c.block_tables.shape == (3, 3) and c.block_tables.dtype == torch.int32 and c.capacity == 48
    assert c.k[0].shape == (9, 16, 2, 16) and c.v[1].shape == (9, 16, 2, 16)
    assert c.nbytes() == 2 * 9 * 16 * dense.kv_bytes_per_token_layer()
    mla = ModelSpec.from_name("tiny-mla")
    m = alloc_kv_cache(mla, [0], batch=2, tokens_per_seq=5, block_size=4)
    assert m.k[0].shape == (4, 4, 32 + 8) and not m.v
    assert m.nbytes() == 4 * 4 * mla.kv_bytes_per_token_layer()


def test_blocks_are_shuffled_disjoint_and_slots_follow_the_tables():
    spec = ModelSpec.from_name("tiny-dense")
    c = alloc_kv_cache(spec, [0], batch=4, tokens_per_seq=64, block_size=8, seed=3)
    flat = c.block_tables.flatten().tolist()
    assert sorted(flat) == list(range(32)) and flat != list(range(32))
    pos, seq = torch.tensor([0, 9, 63]), torch.tensor([1, 1, 3])
    want = [int(c.block_tables[1, 0]) * 8, int(c.block_tables[1, 1]) * 8 + 1, int(c.block_tables[3, 7]) * 8 + 7]
    assert c.slots(pos, seq).tolist() == want
    z = alloc_kv_cache(spec, [0], batch=1, tokens_per_seq=3, fill="zeros")
    assert not z.k[0].any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("row", [(2, 16), (40,), (1, 8)])          # GQA [Hk, Dh]; MLA [L + R]; an index key
def test_kv_write_op_writes_what_index_copy_writes(dtype, row):
    """``tkcc::kv_write`` and the eager ``write_kv`` write the rows index_copy_ writes, also from the
    strided q|k|v views of a fused projection (row stride (Hq + 2 Hk) Dh), and nothing else."""
    g = torch.Generator().manual_seed(0)
    pool = torch.randn(5, 4, *row, generator=g).to(dtype)
    slots = torch.tensor([7, 0, 19, 12])
    fused = torch.randn(4, 3, *row, generator=g).to(dtype)
    for values in (fused[:, 1], fused[:, 2].contiguous()):            # a strided view, a contiguous copy
        want = pool.clone()
        want.view(-1, *row).index_copy_(0, slots, values)
        for write in (kv_write, torch.ops.tkcc.kv_write, write_kv):
            got = pool.clone()
            write(got, slots, values)
            assert torch.equal(got, want), write


def _decode(seed: int = 0, pool_blocks: int = 64):
    """A tiny llama (2 layers) and a decode step of 3 sequences (2 blocks of 16 each) over pools of
    ``pool_blocks`` blocks, as a serving engine's pools are larger than one step's tables: a pool-sized
    tensor in a graph is then a copy of the pool, not the step's gathered pages."""
    m = build_model("tiny-dense", layers=2, device="cpu", dtype=torch.float32, seed=seed)
    wl = make_workload(m, WorkloadPoint("decode", 3, 21), seed)
    g = torch.Generator().manual_seed(seed)
    for pools in (wl.cache.k, wl.cache.v):
        for i, t in pools.items():
            pools[i] = torch.randn(pool_blocks, *t.shape[1:], generator=g)
    return m, wl


def _pools(wl) -> dict:
    return {(name, i): t for name, d in (("k", wl.cache.k), ("v", wl.cache.v)) for i, t in d.items()}


def test_compiled_decode_writes_the_cache_through_the_custom_op():
    """Dynamo's graph of a tiny llama decode step calls ``tkcc.kv_write`` once per pool (never
    index_copy_), and the compiled step gives eager's logits and pools; the eager step never enters the
    op (write_kv calls index_copy_ unless compiling)."""
    m, wl = _decode()
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    pools0 = {k: t.clone() for k, t in _pools(wl).items()}
    with torch.no_grad():
        eager, eager_pools = m.step(wl), {k: t.clone() for k, t in _pools(wl).items()}
        for k, t in _pools(wl).items():
            t.copy_(pools0[k])
        compiled = compiled_decode(m.step, record)(wl)
    assert torch.equal(compiled, eager)
    assert all(torch.equal(t, eager_pools[k]) for k, t in _pools(wl).items())
    assert any(not torch.equal(t, pools0[k]) for k, t in _pools(wl).items())     # the step did write
    targets = [str(n.target) for g in graphs for n in g.graph.nodes if n.op in ("call_function", "call_method")]
    assert sum("kv_write" in t for t in targets) == len(_pools(wl)) == 4
    assert not any("index_copy" in t for t in targets)


def test_functionalized_decode_builds_no_pool_sized_tensor_but_the_kv_writes():
    """The functionalized graph inductor receives (AOT autograd, input mutations kept as inductor keeps
    them) makes no pool-sized tensor out of place except through ``auto_functionalized(kv_write)``,
    which inductor turns back into the in-place call on the pool input; each pool's epilogue ``copy_``
    copies from its kv_write. A traced ``index_copy_`` into the pool's view (before write_kv) became an
    out-of-place ``index_copy`` of the whole pool here, lowered on CUDA (torch 2.11) as two whole-pool
    kernels per write."""
    from torch._dynamo.backends.common import aot_autograd

    m, wl = _decode()
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm

    torch._dynamo.reset()
    with torch.no_grad():
        eager = m.step(wl)
        compiled = compiled_decode(m.step, aot_autograd(fw_compiler=record, keep_inference_input_mutations=True))(wl)
    torch.testing.assert_close(compiled, eager)
    pool_numel = next(iter(_pools(wl).values())).numel()
    (gm,) = graphs
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]

    def pool_sized(n):
        v = n.meta.get("val")
        return isinstance(v, torch.Tensor) and v.numel() == pool_numel

    makers = [n for n in nodes if pool_sized(n) and str(n.target) not in ("aten.copy_.default", "<built-in function getitem>")]
    assert not makers, [str(n.target) for n in makers]
    writes = [n for n in nodes if "auto_functionalized" in str(n.target) and "kv_write" in str(n.args[0])]
    copies = [n for n in nodes if str(n.target) == "aten.copy_.default" and pool_sized(n)]
    assert len(writes) == len(copies) == 4
    assert all(c.args[1].target is operator.getitem and c.args[1].args[0] in writes for c in copies)


@pytest.mark.slow
def test_inductor_writes_the_pools_in_place_without_a_whole_pool_copy(monkeypatch):
    """The graph inductor lowers (after its post-grad passes) calls kv_write on the pool inputs
    themselves: no out-of-place index_copy and no ``copy_`` of another pool-sized tensor into a pool
    (the functionalization epilogue's ``copy_(pool, pool)`` remains, a no-op the lowering drops). A
    traced ``index_copy_`` into the pool's view (before write_kv) left ``index_copy`` + ``copy_(pool,
    new pool)`` there, which CUDA inductor runs as two whole-pool kernels per write (~17 s: C++ compile)."""
    from torch._inductor.graph import GraphLowering

    lowered, init = [], GraphLowering.__init__

    def recording_init(self, gm, *args, **kwargs):
        lowered.append(gm)
        init(self, gm, *args, **kwargs)

    monkeypatch.setattr(GraphLowering, "__init__", recording_init)
    m, wl = _decode()
    torch._dynamo.reset()
    no_caches = (torch._inductor.config.patch(fx_graph_cache=False, fx_graph_remote_cache=False),
                 torch._functorch.config.patch(enable_autograd_cache=False))   # a cache hit skips lowering
    with torch.no_grad(), no_caches[0], no_caches[1]:
        eager = m.step(wl)
        compiled = compiled_decode(m.step)(wl)                          # default backend: inductor
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-4)
    pool_numel = next(iter(_pools(wl).values())).numel()
    (gm,) = lowered
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    pool_copies = [n for n in nodes if str(n.target) == "aten.copy_.default"
                   and n.args[0].meta["val"].numel() == pool_numel and n.args[1] is not n.args[0]]
    assert not pool_copies
    assert not [n for n in nodes if "index_copy" in str(n.target)]
    writes = [n for n in nodes if "kv_write" in str(n.target)]
    assert len(writes) == 4 and all(n.args[0].op == "placeholder" for n in writes)
