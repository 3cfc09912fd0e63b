"""Shared piece of the GPU template tests: run a callable eagerly, warm it up on a side stream, capture it
in a CUDA graph and replay it (a host sync inside ``fn`` fails the capture)."""

from __future__ import annotations


def eager_and_replayed(fn):
    """``(eager_out, replayed_out)`` of ``fn()``: the outputs of one eager call and of one graph replay."""
    import torch

    eager = fn()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = fn()
    graph.replay()
    torch.cuda.synchronize()
    return eager, replayed
