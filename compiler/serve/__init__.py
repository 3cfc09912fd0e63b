"""``tkcc serve``: the OpenAI-compatible app, its runtime, model, request checks, metrics and bench."""
