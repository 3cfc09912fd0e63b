"""Run a measurement of candidate code in a child process: never in the orchestrator.

Candidate sources come from LLMs; the engine runs them in its own process, and so does everything else
the optimize loop does with them after the fleet is closed (the per-op profile of the composed plan,
the plan-vs-torch.compile comparison). ``run_isolated(fn, *args)`` starts a fresh interpreter (the
``spawn`` start method: no state inherited from the orchestrator), calls ``fn(*args, **kwargs)`` there and
returns its (picklable) result; an exception in the child, its death or a timeout is an ``IsolatedError``
with one line saying which. The child's GPU memory is freed when it exits. Cost: one interpreter start
and the imports ``fn`` needs (torch: ~2-5 s).
"""

from __future__ import annotations

import multiprocessing as mp
import os
from typing import Any, Callable


class IsolatedError(RuntimeError):
    """The isolated call raised, died or ran out of time (the message says which)."""


def _child(conn: Any, parent: int, fn: Callable, args: tuple, kwargs: dict) -> None:
    from persistent_engine import watch_parent
    watch_parent(parent)                    # dies with the orchestrator, whatever kills it
    try:
        result = ("ok", fn(*args, **kwargs))
    except BaseException as e:  # noqa: BLE001 - reported to the parent as one line
        result = ("error", f"{type(e).__name__}: {e}"[:2000])
    conn.send(result)
    conn.close()


def run_isolated(fn: Callable, *args: Any, timeout_s: float | None = None, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` in a fresh child process; ``fn`` must be importable by name (module level)."""
    ctx = mp.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, os.getpid(), fn, args, kwargs), daemon=True, name=f"tkcc-{fn.__name__}")
    proc.start()
    send.close()                            # the parent keeps only its reading end: EOF when the child dies
    name = getattr(fn, "__qualname__", repr(fn))
    try:
        if not recv.poll(timeout_s):
            raise IsolatedError(f"{name} did not finish within {timeout_s:g} s (its process was killed)")
        kind, value = recv.recv()
    except EOFError:
        proc.join(5)
        raise IsolatedError(f"{name}: its process died (exit code {proc.exitcode})") from None
    finally:
        recv.close()
        if proc.is_alive():
            proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join()
    if kind == "error":
        raise IsolatedError(f"{name}: {value}")
    return value
