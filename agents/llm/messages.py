"""Typed messages of an LLM conversation, independent of the wire format (SGLang io_struct style).

A conversation is a list of :class:`Message`: ``user`` messages carry text and/or the results of the
previous turn's tool calls; ``assistant`` messages carry text and/or tool calls. The Anthropic and
OpenAI clients translate these to and from the official SDKs' request and response objects
(``agents.llm.anthropic`` / ``agents.llm.openai``), so the agent loop never sees either.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolSpec:
    """One tool offered to the model: name, description and a JSON schema for its arguments."""

    name: str
    description: str
    schema: dict


@dataclass(frozen=True)
class ToolCall:
    """A tool call the model made. ``arguments`` is None when they did not parse; ``raw`` keeps what
    the model sent (a JSON string for OpenAI, the ``input`` value for Anthropic) so that the call
    can be sent back verbatim in the history; ``error`` says what was wrong with it."""

    id: str
    name: str
    arguments: dict | None
    raw: Any = None
    error: str | None = None


@dataclass(frozen=True)
class ToolResult:
    """The answer to one tool call (``content`` is text, usually JSON)."""

    call_id: str
    content: str
    is_error: bool = False


@dataclass(frozen=True)
class Message:
    role: str                                   # "user" | "assistant"
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_results: tuple[ToolResult, ...] = ()


@dataclass(frozen=True)
class TokenCount:
    """Tokens of one reply, from the SDK response's ``usage``: ``input_tokens`` read at the full
    price, ``cache_read_tokens`` served from the prompt cache, ``cache_write_tokens`` written to it
    (Anthropic), ``output_tokens``."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0


@dataclass(frozen=True)
class LLMReply:
    """One model turn: its text, its tool calls, why it stopped, and the tokens it cost."""

    text: str
    tool_calls: tuple[ToolCall, ...]
    stop_reason: str
    tokens: TokenCount = field(default_factory=TokenCount)
    model: str = ""

    def as_message(self) -> Message:
        return Message(role="assistant", text=self.text, tool_calls=self.tool_calls)


class LLMError(RuntimeError):
    """The model could not be reached or answered unusably after all retries."""

    def __init__(self, message: str, *, status: int | None = None, attempts: int = 1):
        super().__init__(message)
        self.status = status
        self.attempts = attempts


class MissingKeyError(LLMError):
    """No API key in the environment: a user error (one line, exit 2)."""

    user_error = True


class MalformedToolCalls(LLMError):
    """The model kept making tool calls that could not be parsed or run."""


def validate_arguments(spec: ToolSpec, args: Any) -> str | None:
    """Check ``args`` against the tool's (flat) JSON schema; None when fine, else what is wrong."""
    if not isinstance(args, dict):
        return f"arguments of {spec.name} must be a JSON object, got {type(args).__name__}"
    props = spec.schema.get("properties", {})
    for name in spec.schema.get("required", []):
        if name not in args:
            return f"{spec.name} needs argument {name!r}"
    types = {"string": str, "integer": int, "number": (int, float), "boolean": bool,
             "object": dict, "array": list}
    for name, value in args.items():
        if name not in props:
            return f"{spec.name} has no argument {name!r} (it takes {sorted(props)})"
        want = types.get(props[name].get("type", ""))
        if want is not None and (not isinstance(value, want) or
                                 (want is int and isinstance(value, bool))):
            return f"argument {name!r} of {spec.name} must be {props[name]['type']}"
    return None
