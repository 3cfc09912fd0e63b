"""persistent_engine: model specs, the generic decoder, the op registry, and the engine that
judges candidates. Imports nothing beyond torch, triton, pyzmq and msgpack; this ``__init__``
stays light so that ``persistent_engine.models.spec`` can be imported without torch.

This is the package's public face for the other packages (tests/test_import_graph.py): the compiler
and the agents import from here, from the subpackage faces (``persistent_engine.models``, ``.ops``,
``.judge``, ``.serving``) or from ``persistent_engine.models.spec`` (the pure-data spec, the only part
``cost_model`` sees), never from a module inside."""

import importlib

# Public name -> "submodule" or "submodule:attribute", imported on first use (most import torch).
_EXPORTS = {
    "ModelSpec": "models.spec", "build_model": "models.decoder", "make_decoder": "models.decoder",
    "load_weights": "models.weights", "checkpoint_of": "models.weights", "hf_to_internal": "models.weights", "internal_to_hf": "models.weights", "WeightsError": "models.weights",
    "make_workload": "inputs.workloads", "measure_suite": "measure.suite", "CPU_SUITE": "measure.suite",
    "profile_point": "measure.profiler", "DEFAULT_BLOCK_SIZE": "ops.opdef",
    "EngineClient": "client", "Supervisor": "supervisor", "CandidateVerdict": "supervisor",
    "EngineStartError": "supervisor", "startup_table": "supervisor", "ProtocolError": "io_struct",
    "POINT_FIELDS": "io_struct", "WorkloadPoint": "io_struct", "point_key": "io_struct", "point_label": "io_struct",
    "RoutingSpec": "inputs.routing", "RoutingError": "inputs.routing", "is_loopback": "server",
    "watch_parent": "lifeline", "stray_processes": "lifeline",
    "driver_version": "versions", "package_version": "versions", "software_versions": "versions",
    "require_sandbox": "executor.sandbox", "sandbox_probe": "executor.sandbox:probe",
    "KERNEL_CACHE_ENV": "executor.kernel_cache", "compiled_default": "executor.compiled_step",
    "baseline_words": "executor.compiled_step", "COMPILED_ENV": "executor.compiled_step",
    "compiled_step": "executor.compiled_step", "opaque": "executor.compiled_step",
    "engine_main": "__main__:main", "parse_layers": "__main__",
    # the candidate contract (candidate.py, stdlib only): parsed statically, imported only where it may run
    "CandidateSource": "candidate", "CONTRACT_NAMES": "candidate", "static_check": "candidate",
    "param_names": "candidate", "import_source": "candidate", "read_contract": "candidate",
    "MODULE_DIR_PREFIX": "candidate",
}
# Public submodules (imported whole): the op registry, the RPC messages, the in-process timers, scratch dirs.
_MODULES = {"registry": "ops.registry", "io_struct": "io_struct", "timing": "measure.timing", "scratch": "scratch"}

__all__ = sorted([*_EXPORTS, *_MODULES])


def __getattr__(name: str):
    if name in _MODULES:
        return importlib.import_module(f"{__name__}.{_MODULES[name]}")
    target = _EXPORTS.get(name)
    if target is None:
        raise AttributeError(f"module 'persistent_engine' has no attribute {name!r}")
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), attr or name)
