"""Dollar cost of tokens. USD per million tokens (input, output), matched by the longest model-name
prefix; list prices at the time of writing — pass ``price=(in, out)`` to an agent to override, and
unknown models (a local server) cost 0 while their tokens are still counted. Prompt-cache reads cost
``CACHE_READ`` of the input price per provider (Anthropic 0.1, OpenAI 0.5 on most models), cache
writes ``CACHE_WRITE`` of it (Anthropic's 5-minute cache)."""

from __future__ import annotations

from agents.llm.messages import TokenCount

PRICES_PER_MTOK: dict[str, tuple[float, float]] = {
    "claude-opus-4": (15.0, 75.0),
    "claude-sonnet-4": (3.0, 15.0),
    "claude-3-7-sonnet": (3.0, 15.0),
    "claude-3-5-sonnet": (3.0, 15.0),
    "claude-haiku-4": (1.0, 5.0),
    "claude-3-5-haiku": (0.8, 4.0),
    "gpt-4.1-nano": (0.1, 0.4),
    "gpt-4.1-mini": (0.4, 1.6),
    "gpt-4.1": (2.0, 8.0),
    "gpt-4o-mini": (0.15, 0.6),
    "gpt-4o": (2.5, 10.0),
    "o4-mini": (1.1, 4.4),
    "o3": (2.0, 8.0),
}


def price_of(model: str) -> tuple[float, float]:
    """(input, output) USD per million tokens for ``model``; (0, 0) when unknown."""
    best = ""
    for prefix in PRICES_PER_MTOK:
        if model.startswith(prefix) and len(prefix) > len(best):
            best = prefix
    return PRICES_PER_MTOK.get(best, (0.0, 0.0))


CACHE_READ = {"anthropic": 0.1, "openai": 0.5}
CACHE_WRITE = 1.25


def cost_usd(tokens: TokenCount, price: tuple[float, float], provider: str = "openai") -> float:
    cached = tokens.cache_read_tokens * CACHE_READ.get(provider, 0.5) + tokens.cache_write_tokens * CACHE_WRITE
    return ((tokens.input_tokens + cached) * price[0] + tokens.output_tokens * price[1]) / 1e6
