"""The read-only web UI over a board (``tkcc ui``): deployments, accepted optimizations, runs with
live progress, the idea board and drift history. See ``app.py`` for the pages."""

from .app import UIConfig, create_app
from .highlight import highlight
from .server import UIServer, serve

__all__ = ["UIConfig", "create_app", "highlight", "UIServer", "serve"]
