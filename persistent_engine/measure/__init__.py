"""Measuring in process, the same way on both sides of the judge/executor wall: the A/B timers and their
statistics (``timing``), the op profiler (``profiler``) and the calibration suite (``suite``). Imports nothing
here, so an executor that needs ``timing`` loads no more than that module."""
