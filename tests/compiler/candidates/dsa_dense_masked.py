"""Sparse MLA as dense MLA attention over each sequence's whole cache with -inf outside the indexer's
selection: a correct (and slower) reformulation of sparse_mla_decode / sparse_mla_prefill."""
import torch


def _masked(q_nope, q_pe, kv_cache, block_tables, seq, topk_indices, scale):
    lat, bs = q_nope.shape[-1], kv_cache.shape[1]
    length = block_tables.shape[1] * bs
    rows = kv_cache[block_tables.long()].reshape(block_tables.shape[0], length, -1)[seq]
    s = torch.einsum("thd,tld->thl", torch.cat([q_nope, q_pe], -1).float(), rows.float()) * scale
    keep = torch.zeros(s.shape[0], length + 1, dtype=torch.bool, device=s.device)   # column `length`: no token
    keep.scatter_(1, torch.where(topk_indices >= 0, topk_indices, length).long(), True)
    keep = keep[:, :length]
    p = torch.softmax(s.masked_fill(~keep[:, None, :], float("-inf")), -1)
    return torch.einsum("thl,tld->thd", p, rows[..., :lat].float()).to(q_nope.dtype)


def sparse_mla_decode(q_nope, q_pe, kv_cache, block_tables, topk_indices, scale):
    seq = torch.arange(q_nope.shape[0], device=q_nope.device)
    return _masked(q_nope, q_pe, kv_cache, block_tables, seq, topk_indices, scale)


def sparse_mla_prefill(q_nope, q_pe, kv_cache, block_tables, cu_seqlens_q, topk_indices, scale):
    t = q_nope.shape[0]
    seq = torch.searchsorted(cu_seqlens_q[1:].long(), torch.arange(t, device=q_nope.device), right=True)
    return _masked(q_nope, q_pe, kv_cache, block_tables, seq.clamp(max=block_tables.shape[0] - 1), topk_indices,
                   scale)


OVERRIDES = {"sparse_mla_decode": sparse_mla_decode, "sparse_mla_prefill": sparse_mla_prefill}
DESCRIPTION = "sparse MLA as masked dense attention"
