"""persistent_engine.executor: the sandboxed process that runs candidate code.

``sandbox`` confines it (namespaces, Landlock, seccomp, rlimits, an allow-listed environment, the
whole tree killed afterwards). Submodules are imported explicitly; this ``__init__`` stays light
(no torch) so the sandbox launcher and the judge can import it cheaply.
"""
