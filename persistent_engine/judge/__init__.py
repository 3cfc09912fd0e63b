"""The judge: the reference slice, the inputs, the tolerances, the clocks and every comparison.

It never imports or runs candidate code: executors (``persistent_engine.executor``) do, on inputs the judge
chose, and hand their outputs back. ``engine.Engine`` serves the RPC (``server.py``); ``ab.py`` times two
executors A/B from outside. Light on import (no torch here).
"""

__all__ = ["Engine", "EngineConfig", "ab", "default_points"]


def __getattr__(name):
    if name == "ab":                    # the A/B timer of two executors (compiler.plan.apply times a plan with it)
        import importlib

        return importlib.import_module(f"{__name__}.ab")
    if name == "default_points":        # the workload points a judge times when none are given
        from persistent_engine.judge.checks import default_points

        return default_points
    if name in __all__:
        from persistent_engine.judge import engine

        return getattr(engine, name)
    raise AttributeError(name)
