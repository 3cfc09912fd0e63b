"""Manifold-constrained hyper-connections (mHC) of DeepSeek-V4: ``hc_mult`` residual streams per token.

Source: Hugging Face transformers, ``models/deepseek_v4/modeling_deepseek_v4.py`` (Apache-2.0):
``DeepseekV4HyperConnection``, ``DeepseekV4HyperHead`` and ``DeepseekV4DecoderLayer.forward``; the paper is
Xie et al., "mHC: Manifold-Constrained Hyper-Connections" (arXiv:2512.24880). The residual of a DeepSeek-V4
layer is ``x[T, N, D]`` (N = ``hc_mult`` = 4 streams). Around each block (attention, then MLP):

    flat   = rms(x.flatten(-2)) (unweighted, eps = rms_norm_eps)               [T, N*D] fp32
    mix    = flat @ fn.T                                                       [T, (2+N)*N]
    pre    = sigmoid(mix[:N] * scale[0] + base[:N]) + hc_eps                   [T, N]
    post   = 2 * sigmoid(mix[N:2N] * scale[1] + base[N:2N])                    [T, N]
    comb   = softmax(mix[2N:].view(N, N) * scale[2] + base[2N:], -1) + hc_eps  [T, N, N]
    comb   = comb / (colsum + hc_eps); then (iters - 1) x (rows, then columns) Sinkhorn steps
    block input = sum_n pre[n] * x[n]                                          [T, D]
    new x  = post[:, :, None] * block_out[:, None, :] + comb^T @ x              [T, N, D]

so ``comb`` is (nearly) doubly stochastic: the residual mixing never amplifies. After the last layer
``hc_head`` collapses the streams with its own ``pre`` weights (no post, no comb).

Ops: ``hc_pre`` (weights + collapse), ``hc_post`` (expand + mix), ``hc_head`` (final collapse). Each reads
the streams once: hc_pre T*N*D elements in, T*D out, plus the [(2+N)*N, N*D] projection; hc_post T*(D + N*D)
in and T*N*D out.
"""

from __future__ import annotations

import torch

from persistent_engine.ops.opdef import MATMUL_TOLERANCES, OpDef, generator, randn, tokens


def _ct(*ts: torch.Tensor) -> torch.dtype:
    """The accumulation dtype of all operands (float32, or float64 when any is)."""
    dt = torch.float32
    for t in ts:
        dt = torch.promote_types(dt, t.dtype)
    return dt


def _unweighted_rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)


def sinkhorn(comb: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """DeepSeek-V4's Sinkhorn-Knopp on positive [..., N, N]: one column step, then iters - 1 (row, column)."""
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    return comb


def hc_pre(x: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, iters: int,
           hc_eps: float, norm_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    t, n, d = x.shape
    ct = _ct(x, fn, scale, base)
    xf, sc, b = x.to(ct), scale.to(ct), base.to(ct)
    mix = _unweighted_rms(xf.reshape(t, n * d), norm_eps) @ fn.to(ct).t()            # [T, (2+N)*N]
    pre = torch.sigmoid(mix[:, :n] * sc[0] + b[:n]) + hc_eps
    post = 2 * torch.sigmoid(mix[:, n:2 * n] * sc[1] + b[n:2 * n])
    comb = torch.softmax(mix[:, 2 * n:].view(t, n, n) * sc[2] + b[2 * n:].view(n, n), dim=-1) + hc_eps
    comb = sinkhorn(comb, iters, hc_eps)
    collapsed = (pre.unsqueeze(-1) * xf).sum(dim=1)
    return collapsed.to(x.dtype), post.float(), comb.float()


def hc_post(out: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    ct = _ct(out, residual, post, comb)
    mixed = post.to(ct).unsqueeze(-1) * out.to(ct).unsqueeze(1) + comb.to(ct).transpose(-1, -2) @ residual.to(ct)
    return mixed.to(residual.dtype)


def hc_head(x: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, hc_eps: float,
            norm_eps: float) -> torch.Tensor:
    t, n, d = x.shape
    ct = _ct(x, fn, scale, base)
    xf = x.to(ct)
    mix = _unweighted_rms(xf.reshape(t, n * d), norm_eps) @ fn.to(ct).t()            # [T, N]
    pre = torch.sigmoid(mix * scale.to(ct)[0] + base.to(ct)) + hc_eps
    return (pre.unsqueeze(-1) * xf).sum(dim=1).to(x.dtype)


# ----------------------------------------------------------------------------- inputs and shapes
def _hc_weights(g, n: int, d: int, rows: int, scales: int, device):
    fn = randn(g, [rows, n * d], torch.float32, device, std=(n * d) ** -0.5 * 2.0)
    scale = 1.0 + 0.5 * randn(g, [scales], torch.float32, device)
    base = randn(g, [rows], torch.float32, device, std=0.5)
    return fn, scale, base


def _pre_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    t, n, d = shape["T"], shape["N"], shape["D"]
    x = randn(g, [t, n, d], dtype, device)
    fn, scale, base = _hc_weights(g, n, d, (2 + n) * n, 3, device)
    return x, fn, scale, base, int(shape.get("iters", 20)), 1e-6, 1e-6


def _post_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    t, n, d = shape["T"], shape["N"], shape["D"]
    x = randn(g, [t, n, d], dtype, device)
    fn, scale, base = _hc_weights(g, n, d, (2 + n) * n, 3, device)
    _, post, comb = hc_pre(x, fn, scale, base, int(shape.get("iters", 20)), 1e-6, 1e-6)
    return randn(g, [t, d], dtype, device), x, post, comb


def _head_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    t, n, d = shape["T"], shape["N"], shape["D"]
    fn, scale, base = _hc_weights(g, n, d, n, 1, device)
    return randn(g, [t, n, d], dtype, device), fn, scale, base, 1e-6, 1e-6


def _shapes(spec, point) -> list[dict]:
    n = int(getattr(spec, "hc_mult", 1) or 1)
    if n <= 1:
        return []
    return [{"T": tokens(point), "N": n, "D": spec.hidden_size, "iters": int(getattr(spec, "hc_sinkhorn_iters", 20))}]


_EXAMPLES = ({"T": 5, "N": 4, "D": 24, "iters": 20}, {"T": 3, "N": 2, "D": 17, "iters": 3},
             {"T": 1, "N": 1, "D": 8, "iters": 1})

OPS = [
    OpDef("hc_pre", hc_pre,
          "hc_pre(x[T, N, D], fn[(2+N)*N, N*D] fp32, scale[3] fp32, base[(2+N)*N] fp32, iters: int, hc_eps, norm_eps) "
          "-> (collapsed[T, D] x.dtype, post[T, N] fp32, comb[T, N, N] fp32): DeepSeek-V4 mHC weights (pre, post, "
          "Sinkhorn-normalised comb) from the unweighted-RMS-normed streams, and the streams collapsed by pre. "
          "shape dict: {'T', 'N', 'D', 'iters'}",
          _pre_inputs, _shapes, _EXAMPLES, outputs=3, tolerances=dict(MATMUL_TOLERANCES)),
    OpDef("hc_post", hc_post,
          "hc_post(out[T, D], residual[T, N, D], post[T, N] fp32, comb[T, N, N] fp32) -> [T, N, D] residual.dtype: "
          "post[:, :, None] * out[:, None] + comb^T @ residual (a block's output expanded to N streams, plus the "
          "mixed residual). shape dict: {'T', 'N', 'D', 'iters'}",
          _post_inputs, _shapes, _EXAMPLES, tolerances=dict(MATMUL_TOLERANCES)),
    OpDef("hc_head", hc_head,
          "hc_head(x[T, N, D], fn[N, N*D] fp32, scale[1] fp32, base[N] fp32, hc_eps, norm_eps) -> [T, D]: the final "
          "collapse of the N streams before the model's last norm. shape dict: {'T', 'N', 'D'}",
          _head_inputs, _shapes, _EXAMPLES, tolerances=dict(MATMUL_TOLERANCES)),
]
