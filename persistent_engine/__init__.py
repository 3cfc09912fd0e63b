"""persistent_engine: model specs, the generic decoder, the op registry, and the engine that
judges candidates. Imports nothing beyond torch, triton, pyzmq and msgpack; this ``__init__``
stays light so that ``persistent_engine.models.spec`` can be imported without torch."""

import importlib

# Public name -> submodule, imported on first use (the submodules import torch).
_EXPORTS = {
    "ModelSpec": "models.spec", "build_model": "models.decoder", "make_workload": "workloads",
    "registry": "ops.registry", "EngineClient": "client", "Supervisor": "supervisor",
    "CandidateVerdict": "supervisor", "startup_table": "supervisor", "ProtocolError": "io_struct",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'persistent_engine' has no attribute {name!r}")
    if name == "registry":
        return importlib.import_module(f"{__name__}.ops.registry")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
