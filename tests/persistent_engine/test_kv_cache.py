import torch

from persistent_engine.models.kv_cache import alloc_kv_cache
from persistent_engine.models.spec import ModelSpec


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
