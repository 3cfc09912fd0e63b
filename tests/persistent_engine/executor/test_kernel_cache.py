"""persistent_engine/executor/kernel_cache.py: what one executor compiled for a source reaches the next
executor of the same source and no other; what an executor left is read with care (no links, no group file
naming paths outside its entry, an allowance per source); the format is Triton's own (its cache manager finds
a seeded group); and through a real engine, the judge seeds a candidate's executor before the source is
imported."""

from __future__ import annotations

import json
import os

import pytest

from persistent_engine.executor import kernel_cache as kc
from persistent_engine.executor.kernel_cache import KernelCache, source_key

SRC, OTHER = "OVERRIDES = {}\n", "OVERRIDES = {}\n# another\n"


def _entry(triton_dir, key="k1", files=(("kernel.cubin", b"\x7fELF" + os.urandom(64)),), group=True):
    d = triton_dir / key
    d.mkdir(parents=True)
    for name, data in files:
        (d / name).write_bytes(data)
    if group:
        child = {name: str(d / name) for name, _ in files}
        (d / "__grp__kernel.json").write_text(json.dumps({"child_paths": child}))
    return d


def test_a_harvested_entry_seeds_the_next_executor_of_the_same_source_only(tmp_path):
    cache = KernelCache(str(tmp_path / "root"))
    first, second, third = tmp_path / "ex1", tmp_path / "ex2", tmp_path / "ex3"
    src_entry = _entry(first)
    assert cache.harvest(SRC, str(first)) == 1 and cache.entries(SRC) == ["k1"]
    assert cache.harvest(SRC, str(first)) == 0                       # kept once
    second.mkdir()
    assert cache.seed(SRC, str(second)) == 1
    assert (second / "k1" / "kernel.cubin").read_bytes() == (src_entry / "kernel.cubin").read_bytes()
    group = json.loads((second / "k1" / "__grp__kernel.json").read_text())["child_paths"]
    assert group == {"kernel.cubin": str(second / "k1" / "kernel.cubin")}   # moved to the new place
    assert not [p for p in os.listdir(second) if p.startswith(".")]      # no temporaries left
    third.mkdir()
    assert cache.seed(OTHER, str(third)) == 0 and os.listdir(third) == []  # never across sources
    assert os.listdir(tmp_path / "root") == [source_key(SRC)]


def test_links_and_groups_that_point_elsewhere_are_not_taken(tmp_path):
    secret = tmp_path / "judge-secret"
    secret.write_bytes(b"token")
    ex = tmp_path / "ex"
    linked = _entry(ex, "k-link", files=(("a.bin", b"x"),), group=False)
    os.symlink(secret, linked / "b.bin")                                  # a file link: the entry is skipped
    (ex / "k-dirlink").symlink_to(tmp_path, target_is_directory=True)     # a directory link: skipped
    outside = _entry(ex, "k-group", files=(("c.bin", b"y"),), group=False)
    (outside / "__grp__c.json").write_text(json.dumps({"child_paths": {"c.bin": str(secret)}}))
    cache = KernelCache(str(tmp_path / "root"))
    assert cache.harvest(SRC, str(ex)) == 1 and cache.entries(SRC) == ["k-group"]
    kept = tmp_path / "root" / source_key(SRC) / "k-group"
    assert sorted(os.listdir(kept)) == ["c.bin"]                          # the group naming the secret: left out
    assert b"token" not in b"".join(p.read_bytes() for p in (tmp_path / "root").rglob("*") if p.is_file())


def test_the_allowance_per_source_holds_and_an_ended_run_gets_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(kc, "MAX_BYTES", 100)
    ex = tmp_path / "ex"
    for i in range(3):
        _entry(ex, f"k{i}", files=((f"f{i}.bin", b"z" * 40),), group=False)
    cache = KernelCache(str(tmp_path / "root"))
    assert cache.harvest(SRC, str(ex)) == 2 and cache.entries(SRC) == ["k0", "k1"]   # 80 of 100 bytes
    assert not [p for p in os.listdir(tmp_path / "root" / source_key(SRC)) if p.startswith(".")]
    ended = KernelCache(str(tmp_path / "gone"))
    os.rmdir(tmp_path / "gone")                                           # the fleet closed its run's cache
    assert ended.harvest(SRC, str(ex)) == 0 and not (tmp_path / "gone").exists()


def test_tritons_cache_manager_finds_a_seeded_group(tmp_path, monkeypatch):
    from triton.runtime.cache import FileCacheManager

    first, second = tmp_path / "ex1", tmp_path / "ex2"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(first))
    m = FileCacheManager("0123abcd")
    paths = {"k.cubin": m.put(b"\x7fELF binary", "k.cubin"), "k.json": m.put('{"name": "k"}', "k.json")}
    m.put_group("k.json", paths)
    cache = KernelCache(str(tmp_path / "root"))
    assert cache.harvest(SRC, str(first)) == 1
    second.mkdir()
    assert cache.seed(SRC, str(second)) == 1
    monkeypatch.setenv("TRITON_CACHE_DIR", str(second))
    group = FileCacheManager("0123abcd").get_group("k.json")
    assert group is not None and set(group) == {"k.cubin", "k.json"}
    assert all(p.startswith(str(second)) for p in group.values())
    assert open(group["k.cubin"], "rb").read() == b"\x7fELF binary"


def test_a_seeded_group_names_the_path_the_executor_sees(tmp_path, monkeypatch):
    """The judge writes into an executor's tmpfs through its view of it; the executor sees the same files at its
    own path (here: a link standing for its mount), and Triton there must find every file of the group."""
    from triton.runtime.cache import FileCacheManager

    first, view, own = tmp_path / "ex1", tmp_path / "judge-view", tmp_path / "own"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(first))
    m = FileCacheManager("0123abcd")
    m.put_group("k.json", {"k.cubin": m.put(b"\x7fELF", "k.cubin"), "k.json": m.put("{}", "k.json")})
    cache = KernelCache(str(tmp_path / "root"))
    assert cache.harvest(SRC, str(first)) == 1
    view.mkdir()
    own.symlink_to(view)
    assert cache.seed(SRC, str(view), str(own)) == 1
    monkeypatch.setenv("TRITON_CACHE_DIR", str(own))
    group = FileCacheManager("0123abcd").get_group("k.json")
    assert set(group) == {"k.cubin", "k.json"} and all(p.startswith(str(own) + os.sep) for p in group.values())


PROBE = '''"""A correct fused_add_rms_norm that fails when its executor's Triton cache holds the kernel cache's entry."""
import torch
from triton.runtime.cache import get_cache_manager

SEEDED = get_cache_manager("0badcafe").get_file("kernel.bin") is not None


def fused_add_rms_norm(x, residual, weight, eps):
    if SEEDED:
        raise RuntimeError("seeded from the kernel cache")
    r = x.float() + residual.float()
    return (r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype), r.to(x.dtype)


OVERRIDES = {"fused_add_rms_norm": fused_add_rms_norm}
'''


@pytest.mark.slow
def test_the_judge_seeds_a_candidates_executor_before_it_imports_the_source(tmp_path, monkeypatch):
    from persistent_engine import KERNEL_CACHE_ENV
    from persistent_engine.supervisor import Supervisor

    from triton.runtime.cache import get_cache_manager

    root = tmp_path / "run-kernels"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "name-only"))
    entry = root / source_key(PROBE) / os.path.basename(get_cache_manager("0badcafe").cache_dir)
    monkeypatch.delenv("TRITON_CACHE_DIR")
    entry.mkdir(parents=True)
    (entry / "kernel.bin").write_bytes(b"compiled")        # as if an earlier executor had compiled it
    sup = Supervisor("tiny-dense", device="cpu", start_timeout_s=300,
                     env={**os.environ, KERNEL_CACHE_ENV: str(root)})
    sup.start()
    try:
        seeded = sup.evaluate(PROBE, timeout_s=300)
        assert not seeded.correct and "seeded from the kernel cache" in " ".join(map(str, seeded.reasons))
        other = sup.evaluate(PROBE + "# not the same source\n", timeout_s=300)
        assert other.correct, other.reasons
    finally:
        sup.close()
