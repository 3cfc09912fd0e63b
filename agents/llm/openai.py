"""OpenAI chat completions (``POST {base_url}/chat/completions``) with tool calls, over httpx; any
OpenAI-compatible server (vLLM, SGLang, a local gateway) works through ``base_url``.

Wire format: the system prompt is the first message; an assistant message carries ``tool_calls``
(``id``, ``type: function``, ``function.name``, ``function.arguments`` as a JSON *string*); each call is
answered by a ``{"role": "tool", "tool_call_id", "content"}`` message. Usage comes back as
``usage.prompt_tokens/completion_tokens``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field


from agents.llm.http import RetryPolicy, WireChat
from agents.llm.messages import (LLMReply, MissingKeyError, Message, TokenCount, ToolCall, ToolSpec,
                                 validate_arguments)

REASONING_PREFIXES = ("o1", "o3", "o4", "gpt-5")


@dataclass(frozen=True)
class OpenAIConfig:
    """Model and endpoint; the defaults read TKCC_OPENAI_MODEL and OPENAI_BASE_URL (a local
    OpenAI-compatible server, e.g. vLLM at http://127.0.0.1:8000/v1, needs no key)."""

    model: str = field(default_factory=lambda: os.environ.get("TKCC_OPENAI_MODEL") or "gpt-4.1")
    base_url: str = field(default_factory=lambda: os.environ.get("OPENAI_BASE_URL")
                          or "https://api.openai.com/v1")
    api_key_env: str = "OPENAI_API_KEY"
    max_tokens: int = 8192
    temperature: float | None = None
    # a key is required for the default endpoint only; a custom base_url may run without auth
    require_key: bool = field(default_factory=lambda: not os.environ.get("OPENAI_BASE_URL"))
    retry: RetryPolicy = field(default_factory=RetryPolicy)


def to_wire(system: str, messages: list[Message], tools: list[ToolSpec], cfg: OpenAIConfig) -> dict:
    out: list[dict] = [{"role": "system", "content": system}]
    for m in messages:
        if m.role == "assistant":
            msg: dict = {"role": "assistant", "content": m.text or None}
            if m.tool_calls:
                msg["tool_calls"] = [
                    {"id": c.id, "type": "function",
                     "function": {"name": c.name,
                                  "arguments": c.raw if isinstance(c.raw, str)
                                  else json.dumps(c.arguments or {})}}
                    for c in m.tool_calls]
            out.append(msg)
        else:
            for r in m.tool_results:
                out.append({"role": "tool", "tool_call_id": r.call_id,
                            "content": ("ERROR: " if r.is_error else "") + r.content})
            if m.text:
                out.append({"role": "user", "content": m.text})
    # OpenAI's reasoning models refuse max_tokens; compatible servers (vLLM, SGLang) expect it
    limit = "max_completion_tokens" if cfg.model.startswith(REASONING_PREFIXES) else "max_tokens"
    body = {"model": cfg.model, "messages": out, limit: cfg.max_tokens,
            "tools": [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                        "parameters": t.schema}} for t in tools]}
    if cfg.temperature is not None:
        body["temperature"] = cfg.temperature
    return body


def from_wire(data: dict, tools: list[ToolSpec]) -> LLMReply:
    """Parse a chat completion; KeyError/TypeError/ValueError when it is not one."""
    by_name = {t.name: t for t in tools}
    choice = data["choices"][0]
    msg = choice["message"]
    calls = []
    for c in msg.get("tool_calls") or []:
        fn = c["function"]
        name, raw = str(fn.get("name", "")), fn.get("arguments")
        spec = by_name.get(name)
        args, error = None, None
        if spec is None:
            error = f"unknown tool {name!r}"
        else:
            try:
                args = json.loads(raw) if isinstance(raw, str) else raw
            except ValueError as exc:
                error = f"arguments of {name} are not valid JSON: {exc}"
            if error is None:
                error = validate_arguments(spec, args)
        calls.append(ToolCall(id=str(c["id"]), name=name, arguments=None if error else args,
                              raw=raw, error=error))
    usage = data.get("usage") or {}
    return LLMReply(text=msg.get("content") or "", tool_calls=tuple(calls),
                    stop_reason=str(choice.get("finish_reason") or ""),
                    tokens=TokenCount(int(usage.get("prompt_tokens", 0)),
                                      int(usage.get("completion_tokens", 0))),
                    model=str(data.get("model", "")))


class OpenAIChat(WireChat):
    """``complete(system, messages, tools) -> LLMReply``; the key comes from ``OPENAI_API_KEY``."""

    to_wire, from_wire = staticmethod(to_wire), staticmethod(from_wire)
    provider = "openai"

    def __init__(self, config: OpenAIConfig | None = None, *, api_key: str | None = None):
        config = config if config is not None else OpenAIConfig()
        key = api_key if api_key is not None else os.environ.get(config.api_key_env)
        if not key and config.require_key:
            raise MissingKeyError(f"set {config.api_key_env} to use the OpenAI agent "
                                  "(or OPENAI_BASE_URL for a local server without a key)")
        headers = {"content-type": "application/json"}
        if key:
            headers["authorization"] = f"Bearer {key}"
        super().__init__(config, config.base_url.rstrip("/") + "/chat/completions", headers)
