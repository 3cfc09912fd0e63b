"""The Anthropic agent's model: the Messages API with tool use through the official ``anthropic`` SDK.

Request: ``system`` as one text block and the tool list, both marked ``cache_control: ephemeral``
(tools then system form the stable prefix, so every turn after the first reads it from the prompt
cache), plus a second breakpoint on the last message (the conversation so far is cached too: each turn
re-sends it). An assistant turn's ``content`` holds ``text`` and ``tool_use`` blocks; the next user
turn answers every ``tool_use`` with a ``tool_result`` block placed before any text. Usage:
``input_tokens`` (uncached), ``cache_read_input_tokens``, ``cache_creation_input_tokens``,
``output_tokens``. Retries, timeouts and rate limits are the SDK's (``max_retries``, ``timeout_s``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from agents.llm.messages import (LLMReply, MissingKeyError, Message, TokenCount, ToolCall, ToolSpec,
                                 validate_arguments)
from agents.llm.sdk import sdk_call

CACHE = {"type": "ephemeral"}


@dataclass(frozen=True)
class AnthropicConfig:
    """Model and endpoint; the defaults read TKCC_ANTHROPIC_MODEL and ANTHROPIC_BASE_URL (None: the
    SDK's own default endpoint). ``max_retries`` and ``timeout_s`` (per attempt) go to the SDK client."""

    model: str = field(default_factory=lambda: os.environ.get("TKCC_ANTHROPIC_MODEL")
                       or "claude-sonnet-4-6")
    base_url: str | None = field(default_factory=lambda: os.environ.get("ANTHROPIC_BASE_URL") or None)
    api_key_env: str = "ANTHROPIC_API_KEY"
    max_tokens: int = 8192
    temperature: float | None = None
    max_retries: int = 4
    timeout_s: float = 120.0
    prompt_cache: bool = True


def request_messages(messages: list[Message], cache_last: bool) -> list[dict]:
    """The conversation as Messages API ``messages`` (``cache_last``: breakpoint on the last block)."""
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
    if cache_last and out and out[-1]["content"]:
        out[-1]["content"][-1] = {**out[-1]["content"][-1], "cache_control": CACHE}
    return out


def parse_message(msg: Any, tools: list[ToolSpec]) -> LLMReply:
    """An SDK ``Message`` as an :class:`LLMReply`; a tool call with a bad name or input is kept with
    its ``error`` (answered to the model as an error result)."""
    by_name = {t.name: t for t in tools}
    texts, calls = [], []
    for block in msg.content:
        if block.type == "text":
            texts.append(block.text)
        elif block.type == "tool_use":
            name, raw = str(block.name), block.input
            spec = by_name.get(name)
            error = f"unknown tool {name!r}" if spec is None else validate_arguments(spec, raw)
            calls.append(ToolCall(id=str(block.id), name=name, arguments=None if error else raw,
                                  raw=raw, error=error))
    u = msg.usage
    return LLMReply(text="\n".join(texts), tool_calls=tuple(calls), stop_reason=str(msg.stop_reason or ""),
                    tokens=TokenCount(int(u.input_tokens or 0), int(u.output_tokens or 0),
                                      int(getattr(u, "cache_read_input_tokens", 0) or 0),
                                      int(getattr(u, "cache_creation_input_tokens", 0) or 0)),
                    model=str(msg.model or ""))


class AnthropicChat:
    """``complete(system, messages, tools) -> LLMReply``; the key comes from ``ANTHROPIC_API_KEY``
    (a :class:`MissingKeyError` names the variable when it is not set)."""

    provider = "anthropic"

    def __init__(self, config: AnthropicConfig | None = None, *, api_key: str | None = None,
                 agent: str = ""):
        import anthropic

        self.config = config if config is not None else AnthropicConfig()
        key = api_key if api_key is not None else os.environ.get(self.config.api_key_env)
        if not key:
            raise MissingKeyError(f"set {self.config.api_key_env} to use the Anthropic agent")
        self._sdk = anthropic
        self._headers = {"x-tkcc-agent": agent} if agent else {}
        self._client = anthropic.Anthropic(api_key=key, base_url=self.config.base_url,
                                           max_retries=self.config.max_retries,
                                           timeout=self.config.timeout_s)

    @property
    def model(self) -> str:
        return self.config.model

    def complete(self, system: str, messages: list[Message], tools: list[ToolSpec]) -> LLMReply:
        cfg = self.config
        cache = cfg.prompt_cache
        system_blocks = [{"type": "text", "text": system, **({"cache_control": CACHE} if cache else {})}]
        kwargs: dict[str, Any] = {
            "model": cfg.model, "max_tokens": cfg.max_tokens, "system": system_blocks,
            "messages": request_messages(messages, cache),
            "tools": [{"name": t.name, "description": t.description, "input_schema": t.schema} for t in tools],
            "extra_headers": self._headers}
        if cfg.temperature is not None:
            kwargs["temperature"] = cfg.temperature
        return sdk_call(lambda: self._client.messages.create(**kwargs), lambda m: parse_message(m, tools),
                        self._sdk, what=f"anthropic {cfg.model}", max_retries=cfg.max_retries)

    def close(self) -> None:
        self._client.close()
