"""persistent_engine: model specs, the generic decoder, the op registry, and the engine that
judges candidates. Imports nothing beyond torch, triton, pyzmq and msgpack; this ``__init__``
stays light so that ``persistent_engine.models.spec`` can be imported without torch."""
