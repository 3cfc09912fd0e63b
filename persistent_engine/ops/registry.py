"""The op registry: lookup by name, the current implementation of each op, and overrides.

The model calls every op through ``call(name, *args)`` (or a handle from ``op(name)``), which runs the
override when one is set and the op's baseline otherwise, so one override reaches every call site.
The baseline is the reference, except for *composite* ops (``fused``: a fusion of finer ops the model
calls as one): their ``default`` composes the fine ops through ``call``, so an override of ``linear``
still runs inside ``add_rms_norm_linear`` unless the composite itself is overridden. Regions (``layers``: a
decoder layer, the decode step) are composites too. Overrides are
process-global (the engine serves one candidate at a time).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Mapping

from persistent_engine.ops import (attention, basic, csa, dsa, dsv4, fused, gemma, gpt_oss, hc, kda, layers,
                                   linear_attention, llama4, mamba, mla, moe, msa, relu2, window)
from persistent_engine.ops.opdef import OpDef

__all__ = ["OpDef", "UnknownOpError", "get", "names", "call", "op", "current", "override", "override_exactly",
           "set_overrides", "clear_overrides", "active_overrides"]


class UnknownOpError(KeyError):
    """An op name the registry does not know (e.g. in a candidate's OVERRIDES)."""

    user_error = True

    def __str__(self) -> str:
        return self.args[0] if self.args else "unknown op"


_OPS: dict[str, OpDef] = {d.name: d for m in (basic, attention, window, moe, mla, dsa, msa, hc, dsv4, csa, kda, fused,
                                               linear_attention, gemma, llama4, gpt_oss, layers, mamba, relu2)
                        for d in m.OPS}
_IMPL: dict[str, Callable] = {name: d.baseline for name, d in _OPS.items()}   # what call() runs
_OVERRIDES: dict[str, Callable] = {}


def names() -> list[str]:
    return list(_OPS)


def get(name: str) -> OpDef:
    try:
        return _OPS[name]
    except KeyError:
        raise UnknownOpError(f"unknown op {name!r}; known ops: {', '.join(_OPS)}") from None


def call(name: str, *args):
    return _IMPL[name](*args)


class _Handle:
    """A callable bound to an op name, resolving the implementation at call time."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __call__(self, *args):
        return _IMPL[self.name](*args)

    def __repr__(self) -> str:
        return f"<op {self.name}>"


def op(name: str) -> _Handle:
    get(name)
    return _Handle(name)


def current(name: str) -> Callable:
    """The implementation ``call(name, ...)`` runs now."""
    get(name)
    return _IMPL[name]


def active_overrides() -> dict[str, Callable]:
    return dict(_OVERRIDES)


def _validate(mapping: Mapping[str, Callable]) -> None:
    for name, fn in mapping.items():
        get(name)
        if not callable(fn):
            raise TypeError(f"override for {name!r} is not callable: {type(fn).__name__}")


def set_overrides(mapping: Mapping[str, Callable]) -> None:
    """Replace all overrides by ``mapping`` (ops not in it go back to their baseline: the reference, or a
    composite's default)."""
    _validate(mapping)
    _OVERRIDES.clear()
    _OVERRIDES.update(mapping)
    for name, d in _OPS.items():
        _IMPL[name] = _OVERRIDES.get(name, d.baseline)


def clear_overrides() -> None:
    set_overrides({})


@contextlib.contextmanager
def override(mapping: Mapping[str, Callable]) -> Iterator[None]:
    """Add ``mapping`` on top of the current overrides for the ``with`` block, then restore them."""
    _validate(mapping)
    saved = dict(_OVERRIDES)
    set_overrides({**saved, **mapping})
    try:
        yield
    finally:
        set_overrides(saved)


@contextlib.contextmanager
def override_exactly(mapping: Mapping[str, Callable]) -> Iterator[None]:
    """Only ``mapping`` for the ``with`` block (every other op at its baseline), then the overrides before it."""
    _validate(mapping)
    saved = dict(_OVERRIDES)
    set_overrides(mapping)
    try:
        yield
    finally:
        set_overrides(saved)
