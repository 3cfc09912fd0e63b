"""The GPU weight sharing's layout logic on CPU (the driver calls run on the H200: hot_reload, optimize)."""

from __future__ import annotations

import pytest
import torch

from persistent_engine.executor.device_share import ALIGN, plan_buckets


def _sizes(*nbytes):
    return {f"t{i}": (n, "bfloat16", (n // 2,)) for i, n in enumerate(nbytes)}


def test_tensors_pack_aligned_and_never_straddle():
    slots, buckets = plan_buckets(_sizes(100, 300, 1000, 10), bucket_bytes=1024)
    for s in slots:
        assert s.offset % ALIGN == 0
        assert s.offset + s.nbytes <= buckets[s.bucket]
    assert [s.bucket for s in slots] == [0, 0, 1, 2]          # 256 + 512 = 768; 1000 needs a fresh one
    ranges = sorted((s.bucket, s.offset, s.offset + s.nbytes) for s in slots)
    assert all(a[0] != b[0] or a[2] <= b[1] for a, b in zip(ranges, ranges[1:])), "no overlap"


def test_a_tensor_larger_than_a_bucket_gets_its_own():
    slots, buckets = plan_buckets(_sizes(10, 5000, 10), bucket_bytes=1024)
    assert [s.bucket for s in slots] == [0, 1, 2]
    assert buckets[1] >= 5000


def test_zero_byte_tensors_take_no_room():
    slots, buckets = plan_buckets(_sizes(0, 256), bucket_bytes=1024)
    assert slots[0].offset == slots[1].offset == 0 and buckets == [256]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (the driver's IPC)")
def test_export_moves_weights_in_place_and_keeps_aliases():
    from persistent_engine.executor.device_share import DeviceWeights
    a = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(7, device="cuda")
    before = (a.clone(), b.clone())
    share = DeviceWeights.export({"a": a, "b": b, "a_tied": a}, "cuda")
    assert torch.equal(a, before[0]) and torch.equal(b, before[1])
    assert len(share.spec["slots"]) == 2 and share.nbytes >= a.numel() * 2 + b.numel() * 4
