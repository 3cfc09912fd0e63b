"""The serving engine on CPU: continuous batching with chunked prefill and prefix caching gives every
request exactly the greedy tokens of a plain full-recompute loop; the block manager's accounting."""

import pytest
import torch

from persistent_engine.models.decoder import build_model
from persistent_engine.serving import BlockManager, ServingConfig, SamplingParams, ServingEngine
from persistent_engine.inputs.workloads import make_workload
from traffic_profiles.scheduler import Scheduler, SchedulerConfig, Seq
from persistent_engine.io_struct import WorkloadPoint


@pytest.fixture(scope="module")
def model():
    return build_model("tiny-dense", device="cpu", dtype=torch.float32, seed=0)


def naive_greedy(m, prompt, n):
    toks = list(prompt)
    for _ in range(n):
        wl = make_workload(m, WorkloadPoint(phase="prefill", batch=1, context=0, chunk=len(toks)), 0,
                           token_ids=torch.tensor(toks), fill="zeros")
        toks.append(int(m.step(wl).argmax(-1)[0]))
    return toks[len(prompt):]


def engine(m, **kw):
    sc = SchedulerConfig(max_num_seqs=kw.pop("max_num_seqs", 3), max_num_batched_tokens=kw.pop("budget", 7))
    return ServingEngine(m, lambda kv: Scheduler(sc, kv), ServingConfig(kv_cache_bytes=1 << 20, **kw))


def run(eng, out=None):
    out = {} if out is None else out
    while eng.has_work():
        for ev in eng.step():
            if ev.token is not None:
                out.setdefault(ev.rid, []).append(ev.token)
    return out


def test_batched_chunked_prefix_cached_output_equals_plain_loop(model):
    eng = engine(model, block_size=4)
    g = torch.Generator().manual_seed(1)
    shared = torch.randint(0, 256, (9,), generator=g).tolist()
    prompts = [shared + torch.randint(0, 256, (k,), generator=g).tolist() for k in (3, 11, 1, 6, 20)]
    for i, p in enumerate(prompts):
        eng.add(i, p, SamplingParams(max_tokens=4 + i, temperature=0))
    out = run(eng)
    assert eng.kv.hit_tokens > 0                              # later prompts reused the shared blocks
    for i, p in enumerate(prompts):
        assert out[i] == naive_greedy(model, p, 4 + i), i
    assert eng.kv.usage == 0.0 and not eng.requests


def test_mixed_batches_run_chunks_and_decodes_as_one_forward_with_the_plain_loops_tokens(model):
    """mixed_batches: a step that holds prompt chunks and decodes runs ONE ragged forward (the decodes as one-token
    chunks after the chunks), and every request still gets the greedy tokens of the plain loop."""
    calls = []

    class Counted:                                  # the model, its forwards recorded
        spec, layers = model.spec, model.layers

        def step(self, wl):
            calls.append(wl.phase)
            return model.step(wl)

    eng = engine(Counted(), block_size=4, mixed_batches=True)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 256, (k,), generator=g).tolist() for k in (3, 14, 2, 9)]
    for i, p in enumerate(prompts):
        eng.add(i, p, SamplingParams(max_tokens=5, temperature=0))
    out, steps = run(eng), eng.steps
    for i, p in enumerate(prompts):
        assert out[i] == naive_greedy(model, p, 5), i
    assert len(calls) == steps                      # one forward a step, mixed ones included
    calls.clear()
    separate = engine(Counted(), block_size=4)
    for i, p in enumerate(prompts):
        separate.add(i, p, SamplingParams(max_tokens=5, temperature=0))
    assert run(separate) == out and len(calls) > separate.steps     # two forwards in the mixed steps


def test_stop_tokens_abort_and_seeded_sampling(model):
    eng = engine(model)
    ref = naive_greedy(model, [1, 2, 3], 6)
    eng.add("stop", [1, 2, 3], SamplingParams(max_tokens=6, temperature=0, stop_token_ids=(ref[2],)))
    eng.add("gone", [4, 5, 6], SamplingParams(max_tokens=50, temperature=0))
    first = {ev.rid: [ev.token] for ev in eng.step()}
    eng.abort("gone")
    out = run(eng, first)
    assert out["stop"] == ref[:ref.index(ref[2]) + 1] and eng.kv.usage == 0.0
    a, b = engine(model), engine(model)
    for e in (a, b):
        e.add("s", [7, 8], SamplingParams(max_tokens=10, temperature=1.0, top_p=0.8, seed=3))
    assert run(a) == run(b)


def test_block_manager_reserves_shares_and_evicts():
    bm = BlockManager(num_blocks=7, block_size=4, max_blocks_per_seq=6)
    s1 = Seq("a", 9, 3)                                       # 12 tokens -> 3 blocks
    bm.expect("a", list(range(9)))
    assert bm.admit(s1) == "ok" and s1.computed == 0 and bm.used_blocks == 3
    bm.commit("a", 9)                                         # 2 full prompt blocks hashed
    s2 = Seq("b", 9, 3)
    bm.expect("b", list(range(9)))
    assert bm.admit(s2) == "ok" and s2.computed == 8          # both full blocks shared
    assert bm.used_blocks == 4 and bm.tables["b"][:2] == bm.tables["a"][:2]
    s3 = Seq("c", 20, 8)
    bm.expect("c", [0] * 20)
    assert bm.admit(s3) == "never"
    s4 = Seq("d", 10, 2)
    bm.expect("d", [1] * 10)
    assert bm.admit(s4) == "wait"                             # 3 blocks needed, 2 free
    bm.release(s1)
    bm.release(s2)
    assert bm.used_blocks == 0
    assert bm.admit(s4) == "ok" and bm.used_blocks == 3


def test_serving_imports_only_torch_and_the_engine_and_the_policy_only_the_stdlib():
    import ast
    import pathlib
    import sys

    root = pathlib.Path(__file__).parents[2]

    def roots(path):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                yield from (a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level:
                yield (node.module or "").split(".")[0]

    std = set(sys.stdlib_module_names) | {"__future__"}
    for f in (root / "persistent_engine/serving").glob("*.py"):
        assert set(roots(f)) <= std | {"torch", "persistent_engine"}, f
    assert set(roots(root / "traffic_profiles/scheduler.py")) <= std


def test_decode_graph_buffers_pad_and_bucket_like_eager(model):
    """The CUDA-graph path's logic on CPU: static buffers per (batch size, table width), padded rows
    writing to the scratch block; outputs equal the eager engine's."""
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (5, 17, 30)]
    outs = []
    for sizes in ((), (2, 4)):
        eng = engine(model, block_size=4, max_model_len=64, cuda_graph_batch_sizes=sizes, budget=64)
        for i, p in enumerate(prompts):
            eng.add(i, p, SamplingParams(max_tokens=6, temperature=0))
        outs.append(run(eng))
        if sizes:
            assert sorted(eng.graphs.graphs) == [(b, w) for b in (2, 4) for w in (2, 4, 8, 16)]
    assert outs[0] == outs[1]


def test_decode_graph_pick_is_the_smallest_size_and_width_that_hold_the_batch(model):
    """A decode replays the smallest captured (size, width) that holds it, and the engine counts the
    padding rows it pays for: with sizes (2, 16, 128) a batch of 3 replays 16 rows (13 of padding),
    with the reference's powers of two 4 rows (1)."""
    from persistent_engine.serving.blocks import SCRATCH_BLOCK

    coarse = engine(model, max_model_len=512, cuda_graph_batch_sizes=(2, 16, 128), max_num_seqs=128).graphs
    fine = engine(model, max_model_len=512, cuda_graph_batch_sizes=(1, 2, 4, 8, 16, 32, 64, 128),
                  max_num_seqs=128).graphs
    assert fine.widths == coarse.widths == [4, 8, 16, 32]
    assert [coarse.pick(n, 5)[0] for n in (1, 2, 3, 16, 17, 128)] == [2, 2, 16, 16, 128, 128]
    assert [fine.pick(n, 5)[0] for n in (1, 2, 3, 5, 9, 17, 33, 65)] == [1, 2, 4, 8, 16, 32, 64, 128]
    assert [fine.pick(3, blocks)[1] for blocks in (1, 4, 5, 9, 17, 32)] == [4, 4, 8, 16, 32, 32]
    with torch.no_grad():
        for graphs in (coarse, fine):
            logits = graphs.run([1] * 3, [0, 1, 2], [0] * 3, [[SCRATCH_BLOCK]] * 3, [1, 2, 3])
            assert logits.shape == (3, model.spec.vocab_size)
    assert (coarse.rows, coarse.padded_rows) == (3, 13) and (fine.rows, fine.padded_rows) == (3, 1)


@pytest.mark.slow
def test_compiled_decode_at_the_reference_graph_sizes_compiles_twice_and_equals_eager():
    """The torch_compile variant captured at the reference's sizes 1..128: size 1, which torch.compile
    specialises, adds the one recompile; every (size, width) buffer gives the eager forward's logits."""
    from persistent_engine.serving.engine import compile_count
    from persistent_engine.serving.blocks import SCRATCH_BLOCK

    torch._dynamo.reset()
    m = build_model("tiny-dense", layers=1, device="cpu", dtype=torch.float32, seed=0)
    sizes = (1, 2, 4, 8, 16, 32, 64, 128)
    eng = engine(m, max_model_len=512, cuda_graph_batch_sizes=sizes, compile=True, compile_backend="eager",
                 max_num_seqs=128)
    c0 = compile_count()
    with torch.no_grad():
        for b in reversed(sizes):                               # the capture order: largest first
            for w in reversed(eng.graphs.widths):
                ctx = [1 + eng.cfg.block_size * (w - 1)] * b          # needs all w blocks: graph (b, w)
                logits = eng.graphs.run([1] * b, list(range(b)), [0] * b, [[SCRATCH_BLOCK] * w] * b, ctx)
                assert torch.equal(logits, m.step(eng.graphs.graphs[(b, w)][1])), (b, w)
    assert compile_count() - c0 == 2 and eng.graphs.padded_rows == 0


@pytest.mark.parametrize("mixed", [False, True])
@pytest.mark.parametrize("name", ["glm+tiny", "minimax+tiny", "mimo+tiny"])
def test_serving_frontier_models_equals_plain_loop(name, mixed):
    """Continuous batching over DSA (indexer keys in the cache), block-sparse attention and MiMo-V2-Flash's windowed
    layers (their own KV heads and V width in the pools) gives the plain loop's greedy tokens; prompts past the toy
    top-k (8 tokens, 2 blocks of 4) and the toy window (8) so the selection and the window matter; ``mixed``: the
    decodes run as one-token chunks beside the prompt chunks (their prefill ops)."""
    m = build_model(name, device="cpu", dtype=torch.float32, seed=0)
    eng = engine(m, block_size=4, mixed_batches=mixed)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 256, (k,), generator=g).tolist() for k in (13, 5, 19)]
    for i, p in enumerate(prompts):
        eng.add(i, p, SamplingParams(max_tokens=3, temperature=0))
    out = run(eng)
    for i, p in enumerate(prompts):
        assert out[i] == naive_greedy(m, p, 3), (name, i)


@pytest.mark.slow
def test_compiled_decode_compiles_once_for_every_graph_size_and_width():
    """The torch_compile variant's decode forward: the capture loop's calls (every graph batch size x
    table width, on the same static buffers as on CUDA) compile one graph, and the eager path's ragged
    batches add at most the size-1 specialisations. tiny-dense's qkv weight has 128 rows: a fully dynamic
    compile (``dynamic=True``) ties batch 128 to it and recompiles at batch 16. Backend "eager": the
    guards and graph count are dynamo's, the same as inductor's, without its code generation."""
    from persistent_engine.serving.engine import compile_count
    from persistent_engine.serving.blocks import SCRATCH_BLOCK

    torch._dynamo.reset()
    m = build_model("tiny-dense", layers=1, device="cpu", dtype=torch.float32, seed=0)
    assert m.blocks[0].attn_in[0].shape[0] == 128
    eng = engine(m, max_model_len=512, cuda_graph_batch_sizes=(2, 16, 128), compile=True, compile_backend="eager",
                 max_num_seqs=128)
    assert eng.graphs.widths == [4, 8, 16, 32]
    c0 = compile_count()
    with torch.no_grad():
        for b in (128, 16, 2):                                  # the capture order: largest first
            for w in (32, 16, 8, 4):
                n = b - 1                                       # one padded row
                ctx = [1 + eng.cfg.block_size * (w - 1)] * n          # needs all w blocks: graph (b, w)
                logits = eng.graphs.run([1] * n, list(range(n)), [0] * n, [[SCRATCH_BLOCK] * w] * n, ctx)
                assert logits.shape == (n, m.spec.vocab_size)
        assert compile_count() - c0 == 1
        for b, w in ((1, 1), (3, 5), (1, 6), (7, 1), (5, 9), (1, 1)):   # the eager path: any batch, any width
            wl = eng._workload("decode", [1] * b, [0] * b, [0] * b, [[SCRATCH_BLOCK] * w] * b, [1] * b,
                               list(range(b + 1)), list(range(b)))
            assert torch.equal(eng.decode_fn(wl), m.step(wl))
    assert compile_count() - c0 <= 4                            # + (batch 1, width 1, both)
