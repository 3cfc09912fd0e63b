"""A wrong sparse_mla_decode: it attends every cached token of the sequence (dense MLA), ignoring the
indexer's selection -- what a model that silently drops index_topk would compute."""
import torch


def sparse_mla_decode(q_nope, q_pe, kv_cache, block_tables, topk_indices, scale):
    lat, bs = q_nope.shape[-1], kv_cache.shape[1]
    length = block_tables.shape[1] * bs
    rows = kv_cache[block_tables.long()].reshape(block_tables.shape[0], length, -1)
    s = torch.einsum("thd,tld->thl", torch.cat([q_nope, q_pe], -1).float(), rows.float()) * scale
    last = topk_indices.max(dim=-1).values                          # the query's own position
    visible = torch.arange(length, device=s.device)[None, :] <= last[:, None]
    p = torch.softmax(s.masked_fill(~visible[:, None, :], float("-inf")), -1)
    return torch.einsum("thl,tld->thd", p, rows[..., :lat].float()).to(q_nope.dtype)


OVERRIDES = {"sparse_mla_decode": sparse_mla_decode}
