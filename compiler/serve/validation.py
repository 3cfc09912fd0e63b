"""Request bodies of ``tkcc serve``: checked field by field, every problem an ``ApiError`` (a 4xx with an
OpenAI error body naming the parameter), never an exception that would become a 500."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from persistent_engine.serving import SamplingParams

DEFAULT_MAX_TOKENS = 16          # /v1/completions, as OpenAI
DEFAULT_CHAT_MAX_TOKENS = 512    # /v1/chat/completions (bounded by the context left)
IGNORED = {"user", "logit_bias", "suffix", "best_of", "service_tier", "store", "metadata", "parallel_tool_calls"}


class ApiError(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 type: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.param, self.status, self.type, self.code = param, status, type, code


@dataclass(frozen=True)
class CompletionArgs:
    prompt: list[int]
    params: SamplingParams
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    max_tokens_given: int | None

    def with_prompt(self, prompt: list[int], runtime) -> "CompletionArgs":
        _check_length(prompt, runtime)
        left = runtime.engine.cfg.max_model_len - len(prompt)
        max_tokens = self.max_tokens_given or min(DEFAULT_CHAT_MAX_TOKENS, left)
        _check_fits(len(prompt), max_tokens, runtime)
        return dataclasses.replace(self, prompt=prompt, params=dataclasses.replace(self.params, max_tokens=max_tokens))


def _number(body: dict, key: str, default: float, lo: float, hi: float) -> float:
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
        raise ApiError(f"'{key}' must be a number in [{lo}, {hi}], got {v!r}", key)
    return float(v)


def _int(body: dict, key: str, lo: int, hi: int | None = None) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        raise ApiError(f"'{key}' must be an integer >= {lo}{'' if hi is None else f' and <= {hi}'}, got {v!r}", key)
    return v


def _check_length(prompt: list[int], runtime) -> None:
    if not prompt:
        raise ApiError("the prompt is empty", "prompt")
    limit = runtime.engine.cfg.max_model_len
    if len(prompt) >= limit:
        raise ApiError(f"This model's maximum context length is {limit} tokens; the prompt has {len(prompt)}",
                       "prompt", code="context_length_exceeded")


def _check_fits(prompt_len: int, max_tokens: int, runtime) -> None:
    limit = runtime.engine.cfg.max_model_len
    if prompt_len + max_tokens > limit:
        raise ApiError(f"This model's maximum context length is {limit} tokens; the prompt ({prompt_len}) plus "
                       f"max_tokens ({max_tokens}) exceed it", "max_tokens", code="context_length_exceeded")


def _common(body: dict, runtime, chat: bool) -> CompletionArgs:
    model = body.get("model")
    if model is not None and model != runtime.name:
        raise ApiError(f"The model '{model}' does not exist; this server serves '{runtime.name}'", "model",
                       status=404, code="model_not_found")
    n = _int(body, "n", 1)
    if n not in (None, 1):
        raise ApiError("only n = 1 is supported", "n")
    for key in ("echo", "logprobs", "functions", "response_format", "top_logprobs") + (() if chat else ("tools",)):
        if body.get(key) not in (None, False, 0):
            raise ApiError(f"'{key}' is not supported by tkcc serve", key)
    for key in ("frequency_penalty", "presence_penalty"):
        if _number(body, key, 0.0, -2.0, 2.0) != 0.0:
            raise ApiError(f"'{key}' is not supported by tkcc serve (only 0)", key)
    key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _int(body, key, 1)
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,) if stop else ()
    elif isinstance(stop, list) and len(stop) <= 4 and all(isinstance(s, str) for s in stop):
        stops = tuple(s for s in stop if s)
    else:
        raise ApiError("'stop' must be a string or a list of at most 4 strings", "stop")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError("'stream' must be a boolean", "stream")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise ApiError("'stream_options' must be an object", "stream_options")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise ApiError("'ignore_eos' must be a boolean", "ignore_eos")
    seed = _int(body, "seed", -(1 << 63), (1 << 63) - 1)
    params = SamplingParams(max_tokens=max_tokens or DEFAULT_MAX_TOKENS,
                            temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
                            top_p=_number(body, "top_p", 1.0, 1e-9, 1.0), seed=seed,
                            stop_token_ids=() if ignore_eos else tuple(runtime.tokenizer.stop_ids))
    return CompletionArgs([], params, stops, stream, bool(opts.get("include_usage")), max_tokens)


def parse_completion(body: dict, runtime) -> CompletionArgs:
    args = _common(body, runtime, chat=False)
    prompt: Any = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]                                   # a batch of one
    if isinstance(prompt, str):
        ids = runtime.tokenizer.encode(prompt)
    elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        vocab = runtime.spec.vocab_size
        if any(not 0 <= t < vocab for t in prompt):
            raise ApiError(f"prompt token ids must be in [0, {vocab})", "prompt")
        ids = list(prompt)
    else:
        raise ApiError("'prompt' must be a string or a list of token ids (one prompt per request)", "prompt")
    _check_length(ids, runtime)
    _check_fits(len(ids), args.params.max_tokens, runtime)
    return dataclasses.replace(args, prompt=ids)


def _content(m: dict, i: int) -> str:
    c = m.get("content")
    if isinstance(c, str):
        return c
    if isinstance(c, list) and all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                                   for p in c):
        return "".join(p["text"] for p in c)
    raise ApiError(f"messages[{i}].content must be a string or a list of text parts", f"messages[{i}].content")


def parse_chat(body: dict, runtime) -> tuple[list[dict], CompletionArgs]:
    args = _common(body, runtime, chat=True)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError("'messages' must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant", "tool"):
            raise ApiError(f"messages[{i}] needs a role of system, user, assistant or tool", f"messages[{i}].role")
        role = "system" if m["role"] == "developer" else m["role"]
        calls = m.get("tool_calls") if role == "assistant" else None
        content = "" if calls and m.get("content") is None else _content(m, i)   # tool calls alone: no content
        out.append({"role": role, "content": content, **({"tool_calls": calls} if calls else {})})
    return out, args
