"""The judge <-> executor wire: framed messages with tensors, and the sealed arena no process can write."""

import mmap
import os
import threading

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


# ------------------------------------------------------------------------------ the reply mailbox
def _mailbox_pair(size=1 << 20):
    import socket as _socket

    from persistent_engine.executor.channel import Channel, Mailbox
    a, b = _socket.socketpair()
    judge_box = Mailbox.create(size)
    executor_box = Mailbox(os.dup(judge_box.fd), size)          # the executor maps the same memfd
    return Channel(a), Channel(b, executor_box), judge_box


def test_mailbox_carries_large_tensors_and_leaves_small_ones_inline():
    from persistent_engine.executor.channel import decode_tensors
    judge, executor, box = _mailbox_pair()
    big = torch.randn(300, 257)                                  # 308 KB: through the box
    small = torch.arange(5)
    flags = torch.rand(300, 300) > 0.5                           # bool: as uint8, back to bool
    executor.send({"big": big, "small": small, "flags": flags, "n": 3})
    raw = judge.recv(5)
    assert "__m__" in raw["big"] and "__t__" in raw["small"] and "__m__" in raw["flags"]
    got = decode_tensors(raw, mailbox=box)
    assert torch.equal(got["big"], big) and torch.equal(got["small"], small) and torch.equal(got["flags"], flags)
    assert got["flags"].dtype == torch.bool and got["n"] == 3
    executor.send({"big": big * 0})                              # the next reply reuses the box: copies stay
    decode_tensors(judge.recv(5), mailbox=box)
    assert torch.equal(got["big"], big)


def test_a_tensor_larger_than_the_box_falls_back_inline():
    from persistent_engine.executor.channel import decode_tensors
    judge, executor, box = _mailbox_pair(size=1 << 16)
    t = torch.randn(100_000)
    sender = threading.Thread(target=executor.send, args=({"t": t},))      # 400 KB inline: more than the
    sender.start()                                                          # socket buffers, so a thread
    raw = judge.recv(5)
    sender.join()
    assert "__t__" in raw["t"]
    assert torch.equal(decode_tensors(raw, mailbox=box)["t"], t)


@pytest.mark.parametrize("ref", [
    {"__m__": "float32", "shape": [4], "offset": (1 << 20) - 8, "nbytes": 16},      # past the end
    {"__m__": "float32", "shape": [5], "offset": 0, "nbytes": 16},                  # size disagrees
    {"__m__": "os.system", "shape": [4], "offset": 0, "nbytes": 16},                 # not a dtype
    {"__m__": "float32", "shape": [-4], "offset": 0, "nbytes": 16},
])
def test_forged_mailbox_references_are_protocol_errors(ref):
    from persistent_engine.executor.channel import ExecutorProtocolError, decode_tensors
    _, _, box = _mailbox_pair()
    with pytest.raises(ExecutorProtocolError):
        decode_tensors({"out": ref}, mailbox=box)
    with pytest.raises(ExecutorProtocolError):
        decode_tensors({"out": {**ref, "offset": 0, "nbytes": 16, "shape": [4], "__m__": "float32"}})   # no box


def test_mailbox_close_is_idempotent():
    from persistent_engine.executor.channel import Mailbox
    box = Mailbox.create(1 << 16)
    box.close()
    box.close()


def test_a_prefaulted_box_still_carries_replies_and_copies_never_alias_it():
    from persistent_engine.executor.channel import decode_tensors
    judge, executor, box = _mailbox_pair(1 << 20)
    executor.mailbox.prefault(1 << 30)                           # clipped to the box: the first MiB written
    big = torch.randn(256, 300)
    executor.send({"big": big})
    got = decode_tensors(judge.recv(5), mailbox=box)
    executor.mailbox.prefault(1 << 20)                           # the executor rewrites its box afterwards
    assert torch.equal(got["big"], big)                          # the judge's copy is its own


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (the judge's copy lands there)")
def test_a_judge_box_on_cuda_copies_straight_to_the_device():
    from persistent_engine.executor.channel import decode_tensors
    judge, executor, box = _mailbox_pair(1 << 20)
    box.device = "cuda"
    big = torch.randn(256, 300)
    executor.send({"big": big})
    got = decode_tensors(judge.recv(5), mailbox=box)["big"]
    assert got.device.type == "cuda" and torch.equal(got.cpu(), big)
