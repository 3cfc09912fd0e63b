"""DeepSeek-V4 hyper-connection ops against an independent per-token formulation (numpy, float64)."""

import numpy as np
import pytest
import torch

from persistent_engine.ops import registry
from persistent_engine.ops.contract import check_op
from persistent_engine.ops.hc import hc_head, hc_post, hc_pre


def _inputs(name, shape, seed=0):
    return registry.get(name).make_inputs(shape, torch.float32, "cpu", seed)


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def _loop_hc_pre(x, fn, scale, base, iters, hc_eps, norm_eps):
    """One token at a time, written from the paper's equations: H_pre, H_post, Sinkhorn-projected H_res."""
    x, fn, scale, base = (np.asarray(a, dtype=np.float64) for a in (x, fn, scale, base))
    t, n, d = x.shape
    outs, posts, combs = [], [], []
    for i in range(t):
        flat = x[i].reshape(-1)
        flat = flat / np.sqrt(np.mean(flat * flat) + norm_eps)
        mix = fn @ flat
        pre = _sigmoid(mix[:n] * scale[0] + base[:n]) + hc_eps
        post = 2.0 * _sigmoid(mix[n:2 * n] * scale[1] + base[n:2 * n])
        logits = (mix[2 * n:] * scale[2] + base[2 * n:]).reshape(n, n)
        m = np.exp(logits - logits.max(axis=1, keepdims=True))
        m = m / m.sum(axis=1, keepdims=True) + hc_eps
        m = m / (m.sum(axis=0, keepdims=True) + hc_eps)
        for _ in range(iters - 1):
            m = m / (m.sum(axis=1, keepdims=True) + hc_eps)
            m = m / (m.sum(axis=0, keepdims=True) + hc_eps)
        outs.append(sum(pre[k] * x[i, k] for k in range(n)))
        posts.append(post)
        combs.append(m)
    return np.stack(outs), np.stack(posts), np.stack(combs)


@pytest.mark.parametrize("shape", [{"T": 5, "N": 4, "D": 24, "iters": 20}, {"T": 3, "N": 2, "D": 17, "iters": 3}])
def test_hc_pre_matches_per_token_loop(shape):
    args = _inputs("hc_pre", shape)
    got = hc_pre(*args)
    want = _loop_hc_pre(*[a.numpy() if torch.is_tensor(a) else a for a in args[:4]], *args[4:])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.double().numpy(), w, rtol=1e-5, atol=1e-6)


def test_comb_is_doubly_stochastic_after_sinkhorn():
    _, _, comb = hc_pre(*_inputs("hc_pre", {"T": 7, "N": 4, "D": 32, "iters": 20}))
    assert (comb > 0).all()
    assert torch.allclose(comb.sum(-1), torch.ones(7, 4), atol=1e-2)     # rows (20 steps: within 0.3%)
    assert torch.allclose(comb.sum(-2), torch.ones(7, 4), atol=1e-5)     # columns (the last step)
    _, _, one_step = hc_pre(*_inputs("hc_pre", {"T": 7, "N": 4, "D": 32, "iters": 1}))
    assert not torch.allclose(one_step.sum(-1), torch.ones(7, 4), atol=1e-1)   # iterations matter


def test_hc_post_with_one_stream_is_a_plain_residual():
    g = torch.Generator().manual_seed(3)
    out, res = torch.randn(6, 16, generator=g), torch.randn(6, 1, 16, generator=g)
    post, comb = torch.ones(6, 1), torch.ones(6, 1, 1)
    torch.testing.assert_close(hc_post(out, res, post, comb), (res[:, 0] + out).unsqueeze(1))


def test_hc_post_matches_loop():
    out, res, post, comb = _inputs("hc_post", {"T": 4, "N": 4, "D": 9})
    want = torch.stack([torch.stack([post[t, k] * out[t] + sum(comb[t, j, k] * res[t, j] for j in range(4))
                                     for k in range(4)]) for t in range(4)])
    torch.testing.assert_close(hc_post(out, res, post, comb), want, rtol=1e-5, atol=1e-6)


def test_hc_head_with_constant_streams_scales_by_pre():
    x, fn, scale, base, hc_eps, norm_eps = _inputs("hc_head", {"T": 3, "N": 4, "D": 8})
    same = x[:, :1].expand(-1, 4, -1).contiguous()
    flat = same.reshape(3, -1)
    pre = torch.sigmoid((flat / flat.square().mean(-1, keepdim=True).add(norm_eps).sqrt()) @ fn.t() * scale + base) + hc_eps
    torch.testing.assert_close(hc_head(same, fn, scale, base, hc_eps, norm_eps), pre.sum(-1, keepdim=True) * x[:, 0])


def test_a_candidate_that_skips_sinkhorn_is_rejected():
    def rows_only(x, fn, scale, base, iters, hc_eps, norm_eps):
        return hc_pre(x, fn, scale, base, 1, hc_eps, norm_eps)
    reasons = check_op("hc_pre", rows_only, dtypes=(torch.float32,))
    assert reasons and any("mismatch" in r for r in reasons)
