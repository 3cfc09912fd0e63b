"""MiniMax-M3's block-sparse decode as dense attention over each sequence's whole cache with -inf outside
the selected blocks: a correct (slower) reformulation of block_sparse_decode."""
import torch


def block_sparse_decode(q, k_cache, v_cache, block_tables, context_lens, blocks, block_size, scale):
    b, hq, dh = q.shape
    hk = k_cache.shape[2]
    length = block_tables.shape[1] * k_cache.shape[1]
    keys = k_cache[block_tables.long()].reshape(b, length, hk, dh).float()
    vals = v_cache[block_tables.long()].reshape(b, length, hk, -1).float()
    pos = torch.arange(length, device=q.device)
    chosen = (blocks[..., None].long() == (pos // block_size)[None, None, None, :]).any(2)          # [B, Hk, L]
    keep = chosen & (pos[None, None, :] < context_lens[:, None, None])
    qg = q.view(b, hk, hq // hk, dh).float()
    s = torch.einsum("bgnd,blgd->bgnl", qg, keys) * scale
    p = torch.softmax(s.masked_fill(~keep[:, :, None, :], float("-inf")), -1)
    return torch.einsum("bgnl,blgd->bgnd", p, vals).reshape(b, hq, -1).to(q.dtype)


OVERRIDES = {"block_sparse_decode": block_sparse_decode}
