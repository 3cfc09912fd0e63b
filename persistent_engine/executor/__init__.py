"""Executors: the processes that run candidate code, one fresh process per candidate (DESIGN.md).

``worker.py`` is the process itself, ``launch.py`` starts it (through the OS sandbox, ``sandbox.py``) and keeps
a warm pool, ``channel.py`` is the wire (framed msgpack, the sealed arena of shared weights and KV caches),
``routes.py`` MoE routing records on that wire. Light on import (no torch here).
"""
