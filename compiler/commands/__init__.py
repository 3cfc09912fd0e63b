"""The ``tkcc`` commands, one module per command group, each with ``register(subparsers)``."""
