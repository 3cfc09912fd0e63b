"""``tkcc plan export``: a plan as a vLLM plugin package."""
