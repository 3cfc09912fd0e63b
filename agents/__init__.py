"""agents (see DESIGN.md)."""
