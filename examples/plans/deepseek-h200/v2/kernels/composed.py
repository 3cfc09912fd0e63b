"""tkcc plan: no accepted optimizations (the reference forward pass)."""
OVERRIDES = {}
