"""compiler/search/agent_spec.py: ``--agents`` strings, ``offline:auto`` (the default) included."""

import pytest

from compiler.search.agent_spec import AgentSpecError, auto_offline, build_agents


def test_auto_starts_more_offline_agents_on_a_gpu_host_with_the_cores():
    assert auto_offline("cpu", cores=2) == 4 and auto_offline("cpu", cores=64) == 4
    assert auto_offline("cuda", cores=16) == 8           # the H200 box: 16 cores
    assert auto_offline("cuda", cores=10) == 5
    assert auto_offline("cuda", cores=2) == 4            # never fewer than on CPU


def test_offline_auto_builds_that_many_agents_with_unique_names(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    cpu, cuda = build_agents("offline:auto", "cpu"), build_agents("offline:auto", "cuda")
    assert len(cpu) == 4 and len(cuda) == 8
    assert len({a.name for a in cuda}) == 8


@pytest.mark.parametrize("spec", ["offline:many", "offline:0", "offline:-1", "robots:2", ""])
def test_a_bad_spec_is_a_user_error(spec):
    with pytest.raises(AgentSpecError):
        build_agents(spec, "cpu")
