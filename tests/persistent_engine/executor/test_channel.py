"""The judge <-> executor wire: framed messages with tensors, and the sealed arena no process can write."""

import mmap
import os

import pytest
import torch

from persistent_engine.executor.channel import Arena, ChannelClosed, channel_pair, decode_tensors
from persistent_engine.executor.channel import Channel


def test_messages_carry_tensors_of_every_dtype_both_ways():
    judge, theirs = channel_pair()
    executor = Channel(theirs)
    sent = {"op": "run", "k": 3, "ids": torch.arange(12).view(3, 4),
            "nested": [torch.randn(2, 5).bfloat16(), {"mask": torch.tensor([True, False])}, None],
            "empty": torch.empty(0, 7, dtype=torch.float16)}
    judge.send(sent)
    got = decode_tensors(executor.recv(timeout=5))
    assert got["op"] == "run" and got["k"] == 3 and torch.equal(got["ids"], sent["ids"])
    assert got["nested"][0].dtype == torch.bfloat16 and torch.equal(got["nested"][0], sent["nested"][0])
    assert torch.equal(got["nested"][1]["mask"], sent["nested"][1]["mask"]) and got["nested"][2] is None
    assert got["empty"].shape == (0, 7) and got["empty"].dtype == torch.float16
    with pytest.raises(TimeoutError):
        judge.recv(timeout=0.05)
    executor.close()
    with pytest.raises(ChannelClosed):
        judge.recv(timeout=5)


def test_the_arena_is_sealed_read_only_and_checked():
    tensors = {"weight.w": torch.randn(64, 32).bfloat16(), "point0.v0.ids": torch.arange(10),
               "point0.v0.cache": torch.randn(3, 4, 5)}
    arena = Arena.build(tensors)
    assert arena.sealed() and arena.unchanged(tensors) == []
    for name, t in tensors.items():
        assert torch.equal(arena.tensor(name), t)
    with pytest.raises(PermissionError):                       # no write through the fd ...
        os.pwrite(arena.fd, b"x", 0)
    with pytest.raises(PermissionError):                       # ... nor a writable shared mapping
        mmap.mmap(arena.fd, arena.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    with pytest.raises(OSError):                               # ... nor a resize
        os.ftruncate(arena.fd, 1)
    sums = arena.checksums()
    assert sums == [arena.chunk_checksum(j) for j in range(len(sums))]
    changed = dict(tensors, **{"point0.v0.ids": torch.arange(10) + 1})
    assert arena.unchanged(changed) == ["point0.v0.ids"]       # the judge's own copies vs the arena's bytes
    view = Arena.open(arena.fd, arena.size, arena.manifest).tensor("weight.w")
    assert torch.equal(view, tensors["weight.w"])
