"""attention_prefill's eager CPU path (per sequence, the context's keys only, through SDPA) against the padded
path every other device runs (persistent_engine/ops/attention.py): the same values on ragged batches, GQA,
a V width other than K's, bf16, and a sequence with no queries in the batch."""

import pytest
import torch

from persistent_engine.ops import attention as attn


def _padded(*args):
    """The padded path itself (what a compiled step or a GPU runs), reached by hiding the CPU."""
    orig = torch.compiler.is_compiling
    torch.compiler.is_compiling = lambda: True
    try:
        return attn.attention_prefill(*args)
    finally:
        torch.compiler.is_compiling = orig


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hq,hk,dh,dv", [(4, 2, 16, 16), (6, 1, 32, 24), (3, 3, 8, 8)])
def test_the_cpu_path_matches_the_padded_one(dtype, hq, hk, dh, dv):
    g = torch.Generator().manual_seed(hq * 100 + dh)
    bs, lens, chunks = 8, [21, 9, 30], [5, 0, 30]             # a whole prompt, a sequence with no queries
    mb = max((n + bs - 1) // bs for n in lens) + 1               # a padded block table, as a serving cache has
    nb = len(lens) * mb
    order = torch.randperm(nb, generator=g).to(torch.int32).reshape(len(lens), mb)
    kc = torch.randn(nb, bs, hk, dh, generator=g).to(dtype)
    vc = torch.randn(nb, bs, hk, dv, generator=g).to(dtype)
    q = torch.randn(sum(chunks), hq, dh, generator=g).to(dtype)
    cu = torch.tensor([0, *torch.tensor(chunks).cumsum(0).tolist()], dtype=torch.int32)
    args = (q, kc, vc, order, cu, torch.tensor(lens, dtype=torch.int32), dh ** -0.5)
    got = attn.attention_prefill(*args)
    want = _padded(*args)
    assert got.shape == want.shape == (sum(chunks), hq, dv) and got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


def test_the_cpu_path_is_the_one_eager_cpu_runs():
    calls = []
    orig = attn._prefill_by_sequence
    attn._prefill_by_sequence = lambda *a: calls.append(1) or orig(*a)
    try:
        q = torch.randn(3, 2, 8)
        kc, vc = torch.randn(2, 4, 1, 8), torch.randn(2, 4, 1, 8)
        attn.attention_prefill(q, kc, vc, torch.tensor([[0, 1]], dtype=torch.int32),
                               torch.tensor([0, 3], dtype=torch.int32), torch.tensor([6], dtype=torch.int32), 0.3)
    finally:
        attn._prefill_by_sequence = orig
    assert calls == [1]
