"""Verification where a plan is served: a sampled fraction of each overridden op's calls is recomputed with
the op's registry reference on the same inputs and compared within the op's per-dtype tolerance (the
judge's op-level check, ``contract.judge_against``). The defence against a kernel that behaves in the
judge's executors and not in the serving process (e.g. one that looks at ``__main__``, its PID or the
environment): only a check where it is served sees what is served.

    checker = SpotChecker(loaded.overrides, fraction=0.02)
    with registry.override(checker.wrapped()):     # every op call goes through the checker's wrapper
        ...                                        # checker.checks / failures / disabled: for /metrics

Each op's calls are numbered; call n is sampled when ``floor((n + 1) * fraction) > floor(n * fraction)``
or n == 0 (the first call of every op is always checked). A sampled call clones its inputs (before the
kernel runs: in-place ops see their pre-state) and its outputs (plus the rows of declared in-place writes);
a background thread runs the reference on the clones (native and upcast precision; on CUDA on a stream of
its own, after an event the serving stream records once the copies are queued) and compares, so the
reference's cost stays off the request's latency path: the serving thread pays only the clones (one copy
of the op's inputs and outputs), and the process shares its cores with the thread's reference work. Calls
input tensors larger than ``max_bytes`` are not copied but shared with the thread (weights: read, never
written) and the check is skipped, and counted, if one was written in place meanwhile (its ``_version``
moved); an op that declares in-place writes (a K/V pool) is copied whole, and skipped when that is larger
than ``max_bytes``. A
mismatch disables that op's override for the rest of the process (its wrapper calls the op's baseline from
then on), is logged in one line and counted. Calls made while a CUDA graph is being captured are not
sampled; a replayed graph calls no Python, so on CUDA the checked steps are the eager ones, and a disable
also calls ``on_disable`` (the runtime drops its decode graphs there, so later decodes run the reference).
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Callable

import torch

log = logging.getLogger("tkcc.spot_check")

DEFAULT_FRACTION = 0.02
MAX_BYTES = 64 << 20          # larger input tensors are shared, not copied (see above)


def _bytes(args) -> int:
    return sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))


def _dtype(args) -> torch.dtype:
    return next((a.dtype for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()), torch.float32)


class _Checked:
    """The override of one op as served: the kernel, or the op's baseline once disabled."""

    def __init__(self, checker: "SpotChecker", name: str, fn: Callable):
        from persistent_engine.ops import registry

        self.checker, self.name, self.fn, self.d, self.calls = checker, name, fn, registry.get(name), 0

    def __call__(self, *args):
        c = self.checker
        if self.name in c.disabled:
            return self.d.baseline(*args)
        n, self.calls = self.calls, self.calls + 1
        sampled = c.fraction > 0 and (n == 0 or int((n + 1) * c.fraction) > int(n * c.fraction))
        if not sampled or (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()):
            return self.fn(*args)
        from persistent_engine.ops import contract

        tensors = contract._tensors(args)
        if self.d.writes and _bytes(tensors) > c.max_bytes:      # in-place pools: only a copy keeps the pre-state
            c.count("skipped")
            return self.fn(*args)
        shared: list = []

        def keep(t: torch.Tensor) -> torch.Tensor:
            if self.d.writes or t.numel() * t.element_size() <= c.max_bytes:
                return t.clone()
            shared.append((t, t._version))                       # a weight: read, never written, not copied
            return t
        snapshot = contract._map(args, keep)
        out = self.fn(*args)
        got = contract._as_tuple(out) + (contract.written_rows(self.d, args) if self.d.writes else ())
        got = tuple(o.detach().clone() if isinstance(o, torch.Tensor) else o for o in got)
        c.submit(self.name, snapshot, got, tuple(shared))
        return out


class SpotChecker:
    """Wraps a plan's overrides; checks run on one daemon thread (``drain`` waits for the queued ones)."""

    def __init__(self, overrides: dict[str, Callable], fraction: float = DEFAULT_FRACTION,
                 max_bytes: int = MAX_BYTES, on_disable: Callable[[set[str]], None] | None = None):
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"--spot-check must be a fraction in [0, 1], got {fraction}")
        self.overrides, self.fraction, self.max_bytes = dict(overrides), float(fraction), int(max_bytes)
        self.on_disable = on_disable
        self.checks = self.failures = self.skipped = 0
        self.disabled: set[str] = set()
        self.lock = threading.Lock()
        self.queue: queue.Queue = queue.Queue(maxsize=64)
        self.thread: threading.Thread | None = None
        self.stream = None                       # CUDA: the checks' own stream

    def wrapped(self, overrides: dict[str, Callable] | None = None) -> dict[str, Callable]:
        """op -> the callable to install in the registry: each of ``overrides`` (default the checker's)
        behind its checking wrapper (the overrides themselves when the fraction is 0)."""
        overrides = self.overrides if overrides is None else overrides
        if self.fraction == 0:
            return dict(overrides)
        return {name: _Checked(self, name, fn) for name, fn in overrides.items()}

    def count(self, what: str) -> None:
        with self.lock:
            setattr(self, what, getattr(self, what) + 1)

    def submit(self, name: str, snapshot: tuple, got: tuple, shared: tuple = ()) -> None:
        ready = None
        if any(t.is_cuda for t in got if isinstance(t, torch.Tensor)):
            ready = torch.cuda.Event()
            ready.record()                       # the copies are complete when the serving stream gets here
        if self.thread is None:
            self.thread = threading.Thread(target=self._worker, name="tkcc-spot-check", daemon=True)
            self.thread.start()
        try:
            self.queue.put_nowait((name, snapshot, got, shared, ready))
        except queue.Full:                       # the checker is behind: never block the serving thread
            self.count("skipped")

    def drain(self) -> None:
        """Wait until every queued check has run (tests, shutdown)."""
        self.queue.join()

    def _worker(self) -> None:
        while True:
            name, snapshot, got, shared, ready = self.queue.get()
            try:
                if ready is None:
                    self._check(name, snapshot, got, shared)
                else:                            # on a stream of its own, after the copies: never in the serving
                    self.stream = stream = self.stream or torch.cuda.Stream()   # stream's queue
                    stream.wait_event(ready)
                    with torch.cuda.stream(stream):
                        self._check(name, snapshot, got, shared)
                        stream.synchronize()     # before the copies are freed to the serving stream's pool
            except Exception as e:  # noqa: BLE001 - a check that cannot run is a failure of the kernel's output
                self._fail(name, f"{type(e).__name__}: {e}")
            finally:
                self.queue.task_done()

    def _check(self, name: str, snapshot: tuple, got: tuple, shared: tuple) -> None:
        from persistent_engine.ops import contract, registry

        d = registry.get(name)
        with torch.no_grad():
            hi = contract._upcast(snapshot)              # before the native reference writes into the copy
            ref_native = contract._as_tuple(d.reference(*snapshot)) + (
                contract.written_rows(d, snapshot) if d.writes else ())
            ref_hi = contract._as_tuple(d.reference(*hi)) + (contract.written_rows(d, hi) if d.writes else ())
            reasons = contract.judge_against(d, got, (ref_native, ref_hi), _dtype(contract._tensors(snapshot)))
        if any(t._version != v for t, v in shared):             # an uncopied input changed meanwhile
            self.count("skipped")
            return
        self.count("checks")
        if reasons:
            self._fail(name, "; ".join(reasons))

    def _fail(self, name: str, why: str) -> None:
        with self.lock:
            self.failures += 1
            new = name not in self.disabled
            self.disabled.add(name)
        if new:
            log.warning("spot check: the plan's override of %s differs from the reference (%s); disabled, "
                        "serving the reference for it from now on", name, why[:300])
            if self.on_disable is not None:
                self.on_disable(set(self.disabled))

    def metrics_lines(self) -> list[str]:
        """Prometheus text lines (the server's ``/metrics``)."""
        with self.lock:
            rows = (("tkcc:spot_checks_total", self.checks, "counter"),
                    ("tkcc:spot_check_failures_total", self.failures, "counter"),
                    ("tkcc:spot_checks_skipped_total", self.skipped, "counter"),
                    ("tkcc:overrides_disabled", len(self.disabled), "gauge"))
        return [line for name, v, kind in rows for line in (f"# TYPE {name} {kind}", f"{name} {v}")]
