"""The OpenAI agent's model through the official ``openai`` SDK: the Responses API where the endpoint
offers it, chat completions with tools otherwise; any OpenAI-compatible server (vLLM, SGLang, a local
gateway) works through ``base_url``.

- Responses (``client.responses.create``, stateless: ``store=False``, the whole history each turn):
  ``instructions`` is the system prompt; ``input`` holds user/assistant messages, ``function_call``
  items (``call_id``, ``name``, ``arguments`` as a JSON string) and ``function_call_output`` items
  answering them. Usage: ``input_tokens`` (of which ``input_tokens_details.cached_tokens`` came from
  the prompt cache), ``output_tokens``.
- Chat completions (``client.chat.completions.create``): the system prompt is the first message; an
  assistant message carries ``tool_calls``, each answered by a ``role: tool`` message. Usage:
  ``prompt_tokens`` (``prompt_tokens_details.cached_tokens`` cached), ``completion_tokens``.

``api="auto"`` tries Responses first and falls back to chat completions for good when the endpoint
answers 404/405 (many compatible servers have no ``/v1/responses``). OpenAI caches long prompt
prefixes by itself; the stable prefix (system prompt, tools) comes first in every request.
Retries, timeouts and rate limits are the SDK's (``max_retries``, ``timeout_s``).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any

from agents.llm.messages import (LLMError, LLMReply, MissingKeyError, Message, TokenCount, ToolCall,
                                 ToolSpec, validate_arguments)
from agents.llm.sdk import sdk_call

log = logging.getLogger("tkcc.agents.llm")

REASONING_PREFIXES = ("o1", "o3", "o4", "gpt-5")
APIS = ("auto", "responses", "chat")
TOOL_CHOICES = ("auto", "required")


class OpenAIConfigError(ValueError):
    """A bad TKCC_OPENAI_* setting: one line, exit 2."""

    user_error = True


def _env_max_tokens() -> int:
    raw = os.environ.get("TKCC_OPENAI_MAX_TOKENS") or "8192"
    if not raw.isdigit() or int(raw) < 1:
        raise OpenAIConfigError(f"TKCC_OPENAI_MAX_TOKENS must be a positive integer, not {raw!r}")
    return int(raw)


@dataclass(frozen=True)
class OpenAIConfig:
    """Model and endpoint; the defaults read TKCC_OPENAI_MODEL, OPENAI_BASE_URL, TKCC_OPENAI_API,
    TKCC_OPENAI_MAX_TOKENS and TKCC_OPENAI_TOOL_CHOICE (a local OpenAI-compatible server, e.g. vLLM at
    http://127.0.0.1:8000/v1, needs no key; a small local model wants a small answer bound and may be
    held to calling tools)."""

    model: str = field(default_factory=lambda: os.environ.get("TKCC_OPENAI_MODEL") or "gpt-4.1")
    base_url: str | None = field(default_factory=lambda: os.environ.get("OPENAI_BASE_URL") or None)
    api_key_env: str = "OPENAI_API_KEY"
    max_tokens: int = field(default_factory=lambda: _env_max_tokens())
    temperature: float | None = None
    api: str = field(default_factory=lambda: os.environ.get("TKCC_OPENAI_API") or "auto")
    # a key is required for the default endpoint only; a custom base_url may run without auth
    require_key: bool = field(default_factory=lambda: not os.environ.get("OPENAI_BASE_URL"))
    max_retries: int = 4
    timeout_s: float = 120.0
    # "required": every turn must call a tool (the server begins the call; for small local models)
    tool_choice: str = field(default_factory=lambda: os.environ.get("TKCC_OPENAI_TOOL_CHOICE") or "auto")

    def __post_init__(self):
        if self.api not in APIS:
            raise OpenAIConfigError(f"OpenAIConfig.api (TKCC_OPENAI_API) must be one of {', '.join(APIS)}, "
                                    f"not {self.api!r}")
        if self.tool_choice not in TOOL_CHOICES:
            raise OpenAIConfigError(f"TKCC_OPENAI_TOOL_CHOICE must be one of {', '.join(TOOL_CHOICES)}, "
                                    f"not {self.tool_choice!r}")


def _call(c: Any, name: str, raw: Any, by_name: dict[str, ToolSpec]) -> ToolCall:
    """A function call whose ``raw`` arguments are a JSON string (checked against the tool's schema)."""
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
    return ToolCall(id=str(c), name=name, arguments=None if error else args, raw=raw, error=error)


def _arguments(c: ToolCall) -> str:
    return c.raw if isinstance(c.raw, str) else json.dumps(c.arguments or {})


# -- chat completions ------------------------------------------------------------------------------
def chat_messages(system: str, messages: list[Message]) -> list[dict]:
    out: list[dict] = [{"role": "system", "content": system}]
    for m in messages:
        if m.role == "assistant":
            msg: dict = {"role": "assistant", "content": m.text or None}
            if m.tool_calls:
                msg["tool_calls"] = [{"id": c.id, "type": "function",
                                      "function": {"name": c.name, "arguments": _arguments(c)}}
                                     for c in m.tool_calls]
            out.append(msg)
        else:
            for r in m.tool_results:
                out.append({"role": "tool", "tool_call_id": r.call_id,
                            "content": ("ERROR: " if r.is_error else "") + r.content})
            if m.text:
                out.append({"role": "user", "content": m.text})
    return out


def parse_chat(resp: Any, tools: list[ToolSpec]) -> LLMReply:
    by_name = {t.name: t for t in tools}
    choice = resp.choices[0]
    msg = choice.message
    calls = [_call(c.id, str(c.function.name), c.function.arguments, by_name) for c in msg.tool_calls or []]
    u = resp.usage
    cached = int(getattr(getattr(u, "prompt_tokens_details", None), "cached_tokens", 0) or 0) if u else 0
    tokens = TokenCount(int(u.prompt_tokens or 0) - cached, int(u.completion_tokens or 0), cached) if u \
        else TokenCount()
    return LLMReply(text=msg.content or "", tool_calls=tuple(calls), stop_reason=str(choice.finish_reason or ""),
                    tokens=tokens, model=str(resp.model or ""))


# -- responses -------------------------------------------------------------------------------------
def response_input(messages: list[Message]) -> list[dict]:
    out: list[dict] = []
    for m in messages:
        if m.role == "assistant":
            if m.text:
                out.append({"role": "assistant", "content": m.text})
            out += [{"type": "function_call", "call_id": c.id, "name": c.name, "arguments": _arguments(c)}
                    for c in m.tool_calls]
        else:
            out += [{"type": "function_call_output", "call_id": r.call_id,
                     "output": ("ERROR: " if r.is_error else "") + r.content} for r in m.tool_results]
            if m.text:
                out.append({"role": "user", "content": m.text})
    return out


def parse_response(resp: Any, tools: list[ToolSpec]) -> LLMReply:
    by_name = {t.name: t for t in tools}
    texts, calls = [], []
    for item in resp.output:
        if item.type == "message":
            texts += [part.text for part in item.content if part.type == "output_text"]
        elif item.type == "function_call":
            calls.append(_call(item.call_id, str(item.name), item.arguments, by_name))
    u = resp.usage
    cached = int(getattr(getattr(u, "input_tokens_details", None), "cached_tokens", 0) or 0) if u else 0
    tokens = TokenCount(int(u.input_tokens or 0) - cached, int(u.output_tokens or 0), cached) if u \
        else TokenCount()
    return LLMReply(text="\n".join(texts), tool_calls=tuple(calls),
                    stop_reason="tool_calls" if calls else str(resp.status or ""), tokens=tokens,
                    model=str(resp.model or ""))


class OpenAIChat:
    """``complete(system, messages, tools) -> LLMReply``; the key comes from ``OPENAI_API_KEY``.
    ``api`` tells which API answered last ("responses" or "chat"; "auto" before the first turn)."""

    provider = "openai"

    def __init__(self, config: OpenAIConfig | None = None, *, api_key: str | None = None, agent: str = ""):
        import openai

        self.config = config if config is not None else OpenAIConfig()
        key = api_key if api_key is not None else os.environ.get(self.config.api_key_env)
        if not key and self.config.require_key:
            raise MissingKeyError(f"set {self.config.api_key_env} to use the OpenAI agent "
                                  "(or OPENAI_BASE_URL for a local server without a key)")
        self._sdk = openai
        self.api = self.config.api
        self._headers = {"x-tkcc-agent": agent} if agent else {}
        # a local server without auth still gets a bearer token: the SDK requires one
        self._client = openai.OpenAI(api_key=key or "no-key", base_url=self.config.base_url,
                                     max_retries=self.config.max_retries, timeout=self.config.timeout_s)

    @property
    def model(self) -> str:
        return self.config.model

    def complete(self, system: str, messages: list[Message], tools: list[ToolSpec]) -> LLMReply:
        if self.api in ("auto", "responses"):
            try:
                reply = self._responses(system, messages, tools)
            except LLMError as exc:
                if self.api != "auto" or exc.status not in (404, 405):
                    raise
                log.info("%s has no Responses API (HTTP %s); using chat completions", self.config.base_url,
                         exc.status)
                self.api = "chat"
            else:
                self.api = "responses"
                return reply
        return self._chat(system, messages, tools)

    def _responses(self, system: str, messages: list[Message], tools: list[ToolSpec]) -> LLMReply:
        cfg = self.config
        kwargs: dict[str, Any] = {
            "model": cfg.model, "instructions": system, "input": response_input(messages), "store": False,
            "max_output_tokens": cfg.max_tokens, "extra_headers": self._headers,
            "tools": [{"type": "function", "name": t.name, "description": t.description,
                       "parameters": t.schema, "strict": False} for t in tools]}
        if cfg.temperature is not None:
            kwargs["temperature"] = cfg.temperature
        if cfg.tool_choice != "auto":
            kwargs["tool_choice"] = cfg.tool_choice
        return sdk_call(lambda: self._client.responses.create(**kwargs), lambda r: parse_response(r, tools),
                        self._sdk, what=f"openai responses {cfg.model}", max_retries=cfg.max_retries)

    def _chat(self, system: str, messages: list[Message], tools: list[ToolSpec]) -> LLMReply:
        cfg = self.config
        # OpenAI's reasoning models refuse max_tokens; compatible servers (vLLM, SGLang) expect it
        limit = "max_completion_tokens" if cfg.model.startswith(REASONING_PREFIXES) else "max_tokens"
        kwargs: dict[str, Any] = {
            "model": cfg.model, "messages": chat_messages(system, messages), limit: cfg.max_tokens,
            "extra_headers": self._headers,
            "tools": [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                        "parameters": t.schema}} for t in tools]}
        if cfg.temperature is not None:
            kwargs["temperature"] = cfg.temperature
        if cfg.tool_choice != "auto":
            kwargs["tool_choice"] = cfg.tool_choice
        return sdk_call(lambda: self._client.chat.completions.create(**kwargs), lambda r: parse_chat(r, tools),
                        self._sdk, what=f"openai chat {cfg.model}", max_retries=cfg.max_retries)

    def close(self) -> None:
        self._client.close()
