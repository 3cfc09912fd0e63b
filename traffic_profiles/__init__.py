"""traffic_profiles: request logs -> traffic profiles, drift verdicts and workload points.

    from traffic_profiles import read_trace, build_profile, compare, replay, RooflineStepTime
    trace = read_trace("prod.parquet")                 # canonical parquet, Azure, Mooncake, BurstGPT
    profile = build_profile(trace)                     # TrafficProfile; profile.save("p.json")
    report = compare(old_profile, profile)             # DriftReport: .drift, .features
    work = replay(trace, RooflineStepTime(...))        # Workload: .points (<= 16 WorkloadPoint)

Imports only numpy, pandas and pyarrow (no torch, no other tkcc package).
"""

from .drift import DriftReport, DriftThresholds, FeatureDrift, compare
from .profile import ProfileConfig, TrafficProfile, build_profile, profile_file
from .readers import read_trace
from .trace import Trace, TraceError
from .workload import (RooflineStepTime, SchedulerConfig, StepShape, Workload, WorkloadPoint, replay,
                       workload_points)
from .writer import write_parquet

__all__ = [
    "DriftReport", "DriftThresholds", "FeatureDrift", "ProfileConfig", "RooflineStepTime",
    "SchedulerConfig", "StepShape", "SynthConfig", "Trace", "TraceError", "TrafficProfile", "Workload",
    "WorkloadPoint", "build_profile", "compare", "generate", "profile_file", "read_trace", "replay",
    "workload_points", "write_parquet",
]


def __getattr__(name: str):
    # synth is also run as ``python -m traffic_profiles.synth``: imported lazily so runpy finds it fresh
    if name in ("SynthConfig", "generate"):
        from . import synth
        return getattr(synth, name)
    raise AttributeError(f"module 'traffic_profiles' has no attribute {name!r}")
