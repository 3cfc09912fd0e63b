"""persistent_engine.executor: the sandboxed processes that run candidate code, one fresh process per candidate.

``sandbox`` confines it (namespaces, Landlock, seccomp, rlimits, an allow-listed environment, the
whole tree killed afterwards); ``worker`` is the process itself, ``launch`` starts it through the
sandbox and keeps a warm pool, ``channel`` is the wire (framed msgpack, the sealed arena of shared
weights and KV caches), ``routes`` MoE routing records on that wire. Submodules are imported
explicitly; this ``__init__`` stays light (no torch) so the judge can import it cheaply.
"""
