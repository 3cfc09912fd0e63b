"""Model specs and the generic decoder.

``ModelSpec`` (pure data) imports without torch; ``build_model`` / ``Decoder`` load torch on first use.
"""

from __future__ import annotations

import importlib

from persistent_engine.models.spec import ALIASES, ModelSpec, SpecError, known_models

__all__ = ["ALIASES", "ModelSpec", "SpecError", "known_models", "build_model", "Decoder", "KVCache",
           "save_weights", "load_weights"]

_LAZY = {"build_model": "decoder", "Decoder": "decoder", "KVCache": "kv_cache", "save_weights": "weights",
         "load_weights": "weights"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
