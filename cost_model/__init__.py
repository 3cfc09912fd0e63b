"""cost_model (see DESIGN.md)."""
