"""Cost-model figures of DeepSeek-V4's pieces at DeepSeek-V4-Flash sizes (hidden 4096, hc_mult 4, 64 heads x 512,
o_groups 8 x rank 1024, window 128, CSA ratio 4 with top-512, HCA ratio 128)."""

from cost_model.ops import compressed_attended_keys, grouped_o_proj_ops, hc_ops, kv_compress_ops


def test_attended_keys_window_plus_entries():
    assert compressed_attended_keys(100, 128, 0, 0) == 100                       # window-only, short context
    assert compressed_attended_keys(1 << 20, 128, 0, 0) == 128
    assert compressed_attended_keys(1 << 20, 128, 4, 512) == 128 + 512            # CSA: the indexer's top-k
    assert compressed_attended_keys(1 << 20, 128, 128, 0) == 128 + 8192           # HCA: every entry
    assert compressed_attended_keys(1000, 128, 4, 512) == 128 + 250


def test_hc_costs_scale_with_streams_and_read_the_streams_once():
    pre1, post1 = hc_ops(8, 1, 4096, 20)
    pre4, post4 = hc_ops(8, 4, 4096, 20)
    assert pre4.flops > 4 * pre1.flops and post4.bytes > 3 * post1.bytes
    # hc_pre's bytes: the streams (8 x 4 x 4096 bf16) + the fp32 [24, 16384] projection + the collapsed output
    assert pre4.bytes == 8 * 4 * 4096 * 2 + 24 * 4 * 4096 * 4 + 8 * 4096 * 2 + 8 * 20 * 4


def test_grouped_output_projection_is_cheaper_than_a_full_one():
    o_a, o_b = grouped_o_proj_ops(16, 64, 512, 8, 1024, 4096, 1.0)
    full = 2.0 * 16 * 64 * 512 * 4096
    assert o_a.flops == 2.0 * 16 * 64 * 512 * 1024 and o_a.flops + o_b.flops < full


def test_kv_compress_pools_one_entry_per_window():
    proj, pool = kv_compress_ops(128, 4096, 512, 4, True, 1.0)
    assert proj.flops == 2.0 * 128 * 4096 * 2048
    assert pool.flops == 32 * 8 * 512 * 6.0
    _, hca = kv_compress_ops(128, 4096, 512, 128, False, 1.0)
    assert hca.flops == 1 * 128 * 512 * 6.0
