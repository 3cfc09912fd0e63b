"""Fixtures shared by the persistent_engine tests: ``verify_candidate``, a judge engine's whole verification
of one candidate source (load, verify, unload)."""

import pytest

from persistent_engine import io_struct as io


def _verify_candidate(e, source: str) -> tuple:
    """(the ``VerifyReply``, the layer-level check's detail or None): ``source`` loaded into engine ``e``,
    verified with seed 11, unloaded whatever the verdict."""
    load = e.handle(io.LoadCandidate(source=source))
    assert load.ok, load.reasons
    try:
        ver = e.handle(io.Verify(seed=11))
    finally:
        e.handle(io.Unload())
    assert isinstance(ver, io.VerifyReply), ver
    layer = [c for c in ver.checks if c.name == "layer"]
    return ver, (layer[0].detail if layer else None)


@pytest.fixture
def verify_candidate():
    return _verify_candidate
