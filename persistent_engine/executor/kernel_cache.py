"""Compiled kernels kept per candidate source, so that a source judged again (the slow tier's confirmation,
the composition's second measurement, a continued run's seeds) does not compile its Triton kernels again.

Each executor has its own Triton cache (``TRITON_CACHE_DIR``, a directory of its workdir: ``sandbox.ENV_WORKDIR``),
so a fresh executor compiles every kernel variant the first time verify calls it. On the H200 (2026-12-04, llama-1b,
``--budget 7m``) that was verify's 5.9 s median of a 6.3 s fast-tier evaluation (a torch-only candidate: 0.14 s),
paid again on the slow tier for the same source. ``harvest`` copies what an executor compiled, once it is killed,
into ``root/<sha256 of the source>/``; ``seed`` copies that into the next executor that loads the same source,
before the source is imported. Entries never cross sources: a cache shared between candidates would let one plant
binaries under another's keys. ``root`` is the engine's own (``KERNEL_CACHE_ENV``, set by the orchestrator, shares
it between the engines of one run).

What an executor left is the candidate's, so it is read with care: only regular files (no links, nothing
followed), at most ``MAX_FILES`` files and ``MAX_BYTES`` bytes per source, and a Triton group file
(``__grp__*.json``: the absolute paths of its entry's files) is rewritten to the new place, or left out when it
names anything outside its own entry (Triton then compiles that kernel again). Layout of a Triton cache:
``<dir>/<key>/<files>``, one directory per compiled kernel variant; an entry lands by one ``rename``, so a
concurrent ``seed`` sees whole entries only. Costs: a copy of a few MB per evaluation, on the judge's side.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import threading

__all__ = ["KernelCache", "KERNEL_CACHE_ENV", "MAX_BYTES", "MAX_FILES", "source_key"]

KERNEL_CACHE_ENV = "TKCC_KERNEL_CACHE_DIR"
MAX_BYTES = 256 << 20                  # per source: a llama-1b template candidate compiles ~10-20 MB
MAX_FILES = 4096
GROUP_PREFIX = "__grp__"
GROUP_MAX_BYTES = 1 << 16


def source_key(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


class _Allowance:
    """What one harvest may still copy."""

    def __init__(self, files: int, nbytes: int):
        self.files, self.bytes = files, nbytes

    def take(self, size: int) -> bool:
        if self.files < 1 or size > self.bytes:
            return False
        self.files, self.bytes = self.files - 1, self.bytes - size
        return True


def _regular_files(entry: str) -> list[tuple[str, int]] | None:
    """(name, size) of the regular files of directory ``entry``; None when it is no plain directory or holds
    anything else (a link, a subdirectory, a device)."""
    try:
        if not stat.S_ISDIR(os.lstat(entry).st_mode):
            return None
        out = []
        for name in sorted(os.listdir(entry)):
            st = os.lstat(os.path.join(entry, name))
            if not stat.S_ISREG(st.st_mode):
                return None
            out.append((name, st.st_size))
        return out
    except OSError:
        return None


def _read_plain(path: str) -> bytes:
    """A file's bytes, never through a link (one swapped in after the listing fails to open)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        return f.read()


def _rewritten_group(data: bytes, old_dir: str, new_dir: str, names: set[str]) -> bytes | None:
    """A Triton group file's JSON with its paths moved from ``old_dir`` to ``new_dir``; None when it is not a
    group of files of its own entry."""
    if len(data) > GROUP_MAX_BYTES:
        return None
    try:
        group = json.loads(data).get("child_paths")
    except (ValueError, AttributeError):
        return None
    if not isinstance(group, dict):
        return None
    moved = {}
    for child, path in group.items():
        # the executor wrote its own path of the entry (not the judge's view of it): the entry's key and a
        # file of it are what must match
        if not (isinstance(path, str) and os.path.basename(os.path.dirname(path)) == os.path.basename(old_dir)
                and os.path.basename(path) in names):
            return None
        moved[child] = os.path.join(new_dir, os.path.basename(path))
    return json.dumps({"child_paths": moved}).encode()


def _copy_entry(src: str, dst_tmp: str, dst_final: str, allowance: _Allowance | None = None) -> bool:
    """Copy one cache entry (directory ``src``) to ``dst_tmp``, its group files pointing at ``dst_final`` (the
    path the process that reads the entry sees: an executor's own, not the judge's view of its tmpfs). False (and
    nothing left at ``dst_tmp``) when it is not a plain entry or over the allowance."""
    files = _regular_files(src)
    if not files:
        return False
    os.makedirs(dst_tmp, mode=0o755)
    try:
        names = {n for n, _ in files}
        for name, size in files:
            if allowance is not None and not allowance.take(size):
                raise OSError("over the kernel cache's allowance")
            data = _read_plain(os.path.join(src, name))
            if name.startswith(GROUP_PREFIX):
                data = _rewritten_group(data, src, dst_final, names)
                if data is None:
                    continue                   # Triton recompiles this kernel: never a wrong binary
            with open(os.path.join(dst_tmp, name), "wb") as f:
                f.write(data)
        return True
    except OSError:
        shutil.rmtree(dst_tmp, ignore_errors=True)
        return False


class KernelCache:
    """Per-source compiled kernels under ``root`` (module doc). Thread-safe; every method is best-effort:
    an I/O error costs a compile, never a load or a verdict."""

    def __init__(self, root: str):
        self.root = root
        os.makedirs(root, mode=0o700, exist_ok=True)
        self._lock = threading.Lock()

    def _dir(self, source: str) -> str:
        return os.path.join(self.root, source_key(source))

    def entries(self, source: str) -> list[str]:
        """The kernel entries kept for ``source``."""
        try:
            return sorted(e for e in os.listdir(self._dir(source)) if not e.startswith("."))
        except OSError:
            return []

    def seed(self, source: str, triton_dir: str, own_dir: str | None = None) -> int:
        """Copy ``source``'s kept entries into an executor's empty-of-them ``triton_dir`` (the judge's view)
        before it loads the source; group files name ``own_dir``, the executor's own path of that directory
        (default ``triton_dir``: the same path). Returns the number of entries copied."""
        kept, n = self._dir(source), 0
        for entry in self.entries(source):
            dst = os.path.join(triton_dir, entry)
            if os.path.lexists(dst):
                continue
            tmp = os.path.join(triton_dir, f".{entry}.seed")
            if _copy_entry(os.path.join(kept, entry), tmp, os.path.join(own_dir or triton_dir, entry)):
                try:
                    os.rename(tmp, dst)
                    n += 1
                except OSError:
                    shutil.rmtree(tmp, ignore_errors=True)
        return n

    def harvest(self, source: str, triton_dir: str) -> int:
        """Keep what a killed executor compiled for ``source`` (entries not kept yet, within the allowance).
        Returns the number of entries kept."""
        if not os.path.isdir(triton_dir) or os.path.islink(triton_dir) or not os.path.isdir(self.root):
            return 0                           # nothing compiled, or the run that owned ``root`` has ended
        kept = self._dir(source)
        with self._lock:
            try:
                os.mkdir(kept, mode=0o700)
            except FileExistsError:
                pass
            have = self.entries(source)
            used = [_regular_files(os.path.join(kept, e)) or [] for e in have]
            allowance = _Allowance(MAX_FILES - sum(len(u) for u in used), MAX_BYTES - sum(s for u in used for _, s in u))
            n = 0
            for entry in sorted(set(os.listdir(triton_dir)) - set(have)):
                if entry.startswith("."):
                    continue
                final = os.path.join(kept, entry)
                tmp = os.path.join(kept, f".{entry}.harvest")
                if _copy_entry(os.path.join(triton_dir, entry), tmp, final, allowance):
                    os.rename(tmp, final)
                    n += 1
            return n
