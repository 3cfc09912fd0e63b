"""traffic_profiles: request logs -> traffic profiles, drift verdicts and workload points.

    from traffic_profiles import read_trace, build_profile, compare, replay, RooflineStepTime
    trace = read_trace("prod.parquet")                 # canonical parquet, Azure, Mooncake, BurstGPT
    profile = build_profile(trace)                     # TrafficProfile; profile.save("p.json")
    report = compare(old_profile, profile)             # DriftReport: .drift, .features
    work = replay(trace, RooflineStepTime(...))        # TrafficWorkload: .points (<= 16 TrafficPoint)

Imports only numpy, pandas and pyarrow (no torch, no other tkcc package).
"""

import importlib

# Public name -> submodule. Imported on first use so that ``import traffic_profiles`` (and the CLI's
# parser) does not pay for pandas.
_EXPORTS = {
    "DriftReport": "drift", "DriftThresholds": "thresholds", "FeatureDrift": "drift", "compare": "drift",
    "ProfileConfig": "profile", "TrafficProfile": "profile", "build_profile": "profile",
    "profile_file": "profile", "rounded_json": "profile", "Scheduler": "scheduler", "read_trace": "readers", "Trace": "trace", "TraceError": "trace",
    "RooflineStepTime": "workload", "SchedulerConfig": "workload", "StepShape": "workload",
    "Slo": "workload", "TrafficWorkload": "workload", "TrafficPoint": "workload", "replay": "workload",
    "workload_points": "workload", "write_parquet": "writer", "SynthConfig": "synth", "generate": "synth",
}

__all__ = [
    "DriftReport", "DriftThresholds", "FeatureDrift", "ProfileConfig", "RooflineStepTime",
    "Scheduler", "SchedulerConfig", "Slo", "StepShape", "SynthConfig", "Trace", "TraceError", "TrafficPoint",
    "TrafficProfile", "TrafficWorkload", "build_profile", "compare", "generate", "profile_file", "read_trace", "replay",
    "rounded_json", "workload_points", "write_parquet",
]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'traffic_profiles' has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
