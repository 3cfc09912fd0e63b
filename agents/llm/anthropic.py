"""Anthropic Messages API (``POST {base_url}/v1/messages``) with tool use, over httpx.

Wire format: ``system`` at the top level; ``messages`` alternate user/assistant; an assistant turn's
``content`` holds ``text`` and ``tool_use`` blocks (``id``, ``name``, ``input`` object); the next user
turn answers every ``tool_use`` with a ``tool_result`` block (``tool_use_id``, ``content``,
``is_error``) placed before any text. Usage comes back as ``usage.input_tokens/output_tokens``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


from agents.llm.http import RetryPolicy, WireChat
from agents.llm.messages import (LLMReply, MissingKeyError, Message, TokenCount, ToolCall, ToolSpec,
                                 validate_arguments)

ANTHROPIC_VERSION = "2023-06-01"


@dataclass(frozen=True)
class AnthropicConfig:
    """Model and endpoint; the defaults read TKCC_ANTHROPIC_MODEL and ANTHROPIC_BASE_URL."""

    model: str = field(default_factory=lambda: os.environ.get("TKCC_ANTHROPIC_MODEL")
                       or "claude-sonnet-4-5")
    base_url: str = field(default_factory=lambda: os.environ.get("ANTHROPIC_BASE_URL")
                          or "https://api.anthropic.com")
    api_key_env: str = "ANTHROPIC_API_KEY"
    max_tokens: int = 8192
    temperature: float | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)


def to_wire(system: str, messages: list[Message], tools: list[ToolSpec], cfg: AnthropicConfig) -> dict:
    out = []
    for m in messages:
        blocks: list[dict] = []
        if m.role == "assistant":
            if m.text:
                blocks.append({"type": "text", "text": m.text})
            for c in m.tool_calls:
                inp = c.arguments if c.arguments is not None else (c.raw if isinstance(c.raw, dict) else {})
                blocks.append({"type": "tool_use", "id": c.id, "name": c.name, "input": inp})
        else:
            for r in m.tool_results:
                blocks.append({"type": "tool_result", "tool_use_id": r.call_id, "content": r.content,
                               "is_error": r.is_error})
            if m.text:
                blocks.append({"type": "text", "text": m.text})
        out.append({"role": m.role, "content": blocks})
    body = {"model": cfg.model, "max_tokens": cfg.max_tokens, "system": system, "messages": out,
            "tools": [{"name": t.name, "description": t.description, "input_schema": t.schema}
                      for t in tools]}
    if cfg.temperature is not None:
        body["temperature"] = cfg.temperature
    return body


def from_wire(data: dict, tools: list[ToolSpec]) -> LLMReply:
    """Parse a Messages API response; KeyError/TypeError/ValueError when it is not one."""
    if data.get("type") == "error":
        raise ValueError(f"error body: {data.get('error')}")
    by_name = {t.name: t for t in tools}
    texts, calls = [], []
    for block in data["content"]:
        kind = block["type"]
        if kind == "text":
            texts.append(block["text"])
        elif kind == "tool_use":
            name, raw = str(block.get("name", "")), block.get("input")
            spec = by_name.get(name)
            error = (f"unknown tool {name!r}" if spec is None else validate_arguments(spec, raw))
            calls.append(ToolCall(id=str(block["id"]), name=name,
                                  arguments=None if error else raw, raw=raw, error=error))
    usage = data.get("usage") or {}
    return LLMReply(text="\n".join(texts), tool_calls=tuple(calls),
                    stop_reason=str(data.get("stop_reason") or ""),
                    tokens=TokenCount(int(usage.get("input_tokens", 0)),
                                      int(usage.get("output_tokens", 0))),
                    model=str(data.get("model", "")))


class AnthropicChat(WireChat):
    """``complete(system, messages, tools) -> LLMReply``; the key comes from ``ANTHROPIC_API_KEY``."""

    to_wire, from_wire = staticmethod(to_wire), staticmethod(from_wire)
    provider = "anthropic"

    def __init__(self, config: AnthropicConfig | None = None, *, api_key: str | None = None):
        config = config if config is not None else AnthropicConfig()
        key = api_key if api_key is not None else os.environ.get(config.api_key_env)
        if not key:
            raise MissingKeyError(f"set {config.api_key_env} to use the Anthropic agent")
        super().__init__(config, config.base_url.rstrip("/") + "/v1/messages",
                         {"x-api-key": key, "anthropic-version": ANTHROPIC_VERSION,
                          "content-type": "application/json"})
