"""``tkcc serve``: the OpenAI-compatible app (``openai_app``), its runtime, model, request checks, metrics and bench."""
