"""The serving engine: continuous batching, paged KV with prefix caching, CUDA graphs for decode.

Torch only (no HTTP here: ``compiler.serve`` is the OpenAI-compatible front). The scheduling policy is
injected (``traffic_profiles.scheduler.Scheduler`` in tkcc), so the trace replay and the server run
the same one.
"""

from persistent_engine.serving.blocks import BlockManager
from persistent_engine.serving.engine import KNOBS, ServingConfig, ServingEngine, TokenEvent
from persistent_engine.serving.sampling import SamplingParams

__all__ = ["BlockManager", "ServingConfig", "KNOBS", "SamplingParams", "ServingEngine", "TokenEvent"]
