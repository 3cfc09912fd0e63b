"""A real HTTP server on 127.0.0.1 that speaks the Anthropic Messages API (``POST /v1/messages``),
OpenAI chat completions (``POST /v1/chat/completions``) and the OpenAI Responses API
(``POST /v1/responses``) closely enough that the official ``anthropic`` and ``openai`` SDK clients
accept its answers (their response parsing is the test), replaying recorded tool-call conversations.
No network, no key, deterministic: the LLM agents are tested against it.

A script is a list of steps, replayed in order per conversation key, each step in a neutral form
rendered into whichever wire format was asked. The key is ``"<model>@<agent>"`` when the request's
``x-tkcc-agent`` header names an agent with a script of its own, else the request's ``model``.

- ``{"text": "...", "tool_calls": [{"name": "read_op", "input": {"name": "rms_norm"}}],
  "usage": {"input": 120, "output": 30, "cached": 0}}``: one assistant turn (``tool_calls``
  optional); a call may give ``"raw": "{not json"`` instead of ``input`` to send malformed arguments;
- ``{"fault": 429 | 500 | 503 | 529, "times": n}``: answer with that HTTP status n times, with a
  ``retry-after`` header of ``retry_after`` seconds when the step gives one (else ``retry-after-ms``
  of the server's ``retry_after_ms``, so that the SDKs' backoff stays short in tests);
- ``{"fault": "malformed", "times": n}``: 200 with a body that is not the expected JSON;
- ``"delay_s": x`` on any step: wait x seconds before answering (a client timeout shorter than that
  gives up and retries; the step is consumed either way);
- ``"expect": ["substring", ...]`` on any step: the request's last message must contain each
  substring in one of its strings (e.g. a verdict the agent must have sent back), otherwise 400.

Every request is also checked against the wire format (auth header, required fields, every tool call
answered by a tool result in the next message); a violation is answered with HTTP 400 and recorded
in ``protocol_errors`` (``api_key=None`` skips the auth check, like a local server). A key whose
script is used up is answered with a plain closing text. ``responses_api=False`` answers
``/v1/responses`` with 404, like a compatible server that lacks it.
Fixtures are JSON files ``{"scripts": {key: [steps]}}``; :meth:`ScriptedLLMServer.from_fixture`.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

EXHAUSTED_TEXT = "Nothing more to try."


@dataclass(frozen=True)
class RecordedRequest:
    path: str
    model: str
    status: int
    body: dict | None


class ScriptedLLMServer:
    """``with ScriptedLLMServer(scripts) as srv:`` serves on ``srv.url`` (an ephemeral port)."""

    def __init__(self, scripts: dict[str, list[dict]], *, api_key: str | None = "test-key",
                 host: str = "127.0.0.1", port: int = 0, responses_api: bool = True,
                 retry_after_ms: int = 10):
        self._queues: dict[str, list[dict]] = {m: self._expand(s) for m, s in scripts.items()}
        self.api_key = api_key
        self.responses_api = responses_api
        self.retry_after_ms = retry_after_ms
        self.requests: list[RecordedRequest] = []
        self.protocol_errors: list[str] = []
        self._lock = threading.Lock()
        self._ids = 0
        self._httpd = ThreadingHTTPServer((host, port), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @classmethod
    def from_fixture(cls, path: str | Path, **kwargs: Any) -> "ScriptedLLMServer":
        return cls(json.loads(Path(path).read_text())["scripts"], **kwargs)

    @staticmethod
    def _expand(steps: list[dict]) -> list[dict]:
        out = []
        for step in steps:
            out.extend([step] * int(step.get("times", 1)))
        return out

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def remaining(self, model: str) -> int:
        with self._lock:
            return len(self._queues.get(model, []))

    def start(self) -> "ScriptedLLMServer":
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,),
                                        name="scripted-llm", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> "ScriptedLLMServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- request handling ----------------------------------------------------------------------
    def _next_id(self, prefix: str) -> str:
        with self._lock:
            self._ids += 1
            return f"{prefix}_{self._ids:06d}"

    def handle(self, path: str, headers: dict[str, str], raw: bytes) -> tuple[int, dict, str]:
        """(status, extra headers, body text) for one POST."""
        routes = {"/v1/messages": "anthropic", "/v1/chat/completions": "openai"}
        if self.responses_api:
            routes["/v1/responses"] = "responses"
        fmt = routes.get(path)
        if fmt is None:
            return self._record(path, "", 404, None, _err(f"no route {path}"))
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("body is not an object")
        except ValueError as exc:
            return self._record(path, "", 400, None, _err(f"invalid JSON: {exc}"), protocol=True)
        model = str(body.get("model", ""))
        problem = _CHECKS[fmt](headers, body, self.api_key)
        if problem:
            return self._record(path, model, 400, body, _err(problem), protocol=True)
        with self._lock:
            agent_key = f"{model}@{headers.get('x-tkcc-agent', '')}"
            key = agent_key if agent_key in self._queues else model
            queue = self._queues.get(key) or [{"text": EXHAUSTED_TEXT}]
            step = queue[0]
            missing = [n for n in step.get("expect", [])
                       if n not in _text_of(_last_message(fmt, body))]
            if not missing and self._queues.get(key):
                queue.pop(0)
        if missing:  # the step stays queued: the client may retry with the right history
            return self._record(path, model, 400, body,
                                _err(f"expected {missing[0]!r} in the last message"), protocol=True)
        if step.get("delay_s"):
            time.sleep(float(step["delay_s"]))
        fault = step.get("fault")
        if fault == "malformed":
            return self._record(path, model, 200, body, "{\"choices\": [ {\"mess")
        if fault is not None:
            extra = ({"retry-after": str(step["retry_after"])} if "retry_after" in step
                     else {"retry-after-ms": str(self.retry_after_ms)})
            return self._record(path, model, int(fault), body,
                                _err(f"scripted HTTP {fault}"), extra=extra)
        return self._record(path, model, 200, body, json.dumps(_RENDER[fmt](step, model, self._next_id)))

    def _record(self, path: str, model: str, status: int, body: dict | None, text: str, *,
                protocol: bool = False, extra: dict | None = None) -> tuple[int, dict, str]:
        with self._lock:
            self.requests.append(RecordedRequest(path, model, status, body))
            if protocol:
                self.protocol_errors.append(f"{path} {model}: {text}")
        return status, extra or {}, text

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - http.server naming
                n = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(n)
                headers = {k.lower(): v for k, v in self.headers.items()}
                status, extra, text = server.handle(self.path, headers, raw)
                data = text.encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("request-id", f"req_{len(server.requests):06d}")
                self.send_header("content-length", str(len(data)))
                for k, v in extra.items():
                    self.send_header(k, v)
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                    self.close_connection = True

            def log_message(self, *args: Any) -> None:  # quiet
                return

        return Handler


def _err(message: str) -> str:
    return json.dumps({"type": "error", "error": {"type": "scripted_error", "message": message}})


def _last_message(fmt: str, body: dict) -> Any:
    if fmt == "responses":  # the trailing function_call_output items, or the last input item
        items = body.get("input")
        if isinstance(items, str) or not items:
            return items
        tail = []
        for item in reversed(items):
            if item.get("type") != "function_call_output":
                break
            tail.append(item)
        return list(reversed(tail)) or items[-1]
    msgs = body.get("messages") or []
    if fmt == "openai":  # the trailing tool messages together form the "last message"
        tail = []
        for m in reversed(msgs):
            tail.append(m)
            if m.get("role") != "tool":
                break
        return list(reversed(tail))
    return msgs[-1] if msgs else None


def _text_of(obj: Any) -> str:
    """Every string inside ``obj``, one per line (what ``expect`` searches)."""
    if isinstance(obj, str):
        return obj
    if isinstance(obj, dict):
        return "\n".join(_text_of(v) for v in obj.values())
    if isinstance(obj, list):
        return "\n".join(_text_of(v) for v in obj)
    return ""


def _bearer(headers: dict) -> str | None:
    auth = headers.get("authorization") or ""
    return auth[len("Bearer "):] if auth.startswith("Bearer ") else None


def _wrong_bearer(headers: dict, key: str | None) -> bool:
    """A key is required and the request's ``Authorization: Bearer`` token is not it (OpenAI's two APIs)."""
    return key is not None and _bearer(headers) != key


def _check_anthropic(headers: dict, body: dict, key: str | None) -> str | None:
    # the key as x-api-key or (newer SDKs) as a bearer token
    if key is not None and key not in (headers.get("x-api-key"), _bearer(headers)):
        return "missing or wrong API key (x-api-key or Authorization: Bearer)"
    if not headers.get("anthropic-version"):
        return "missing anthropic-version header"
    if not isinstance(body.get("max_tokens"), int):
        return "max_tokens (int) is required"
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs or msgs[0].get("role") != "user":
        return "messages must be a non-empty list starting with a user message"
    for tool in body.get("tools", []):
        if "name" not in tool or not isinstance(tool.get("input_schema"), dict):
            return "each tool needs name and input_schema"
    for i, m in enumerate(msgs):
        if m.get("role") != ("user" if i % 2 == 0 else "assistant"):
            return f"message {i}: roles must alternate user/assistant"
        content = m.get("content")
        if isinstance(content, str):
            continue
        if not isinstance(content, list):
            return f"message {i}: content must be a string or a list of blocks"
        uses = [b["id"] for b in content if b.get("type") == "tool_use"]
        if uses:
            if i + 1 >= len(msgs):
                return f"message {i}: tool_use without a following user message"
            nxt = msgs[i + 1].get("content")
            answered = [b.get("tool_use_id") for b in nxt if b.get("type") == "tool_result"] \
                if isinstance(nxt, list) else []
            if sorted(answered) != sorted(uses):
                return f"message {i + 1}: tool_result ids {answered} do not answer {uses}"
            kinds = [b.get("type") for b in nxt]
            if kinds[:len(answered)] != ["tool_result"] * len(answered):
                return f"message {i + 1}: tool_result blocks must come first"
        for b in content:
            if b.get("type") == "tool_use" and not isinstance(b.get("input"), dict):
                return f"message {i}: tool_use input must be an object"
    return None


def _check_openai(headers: dict, body: dict, key: str | None) -> str | None:
    if _wrong_bearer(headers, key):
        return "missing or wrong Authorization bearer token"
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        return "messages must be a non-empty list"
    for tool in body.get("tools", []):
        if tool.get("type") != "function" or "name" not in tool.get("function", {}):
            return "each tool needs type function and function.name"
    pending: list[str] = []
    for i, m in enumerate(msgs):
        role = m.get("role")
        if role == "tool":
            if m.get("tool_call_id") not in pending:
                return f"message {i}: tool_call_id {m.get('tool_call_id')} answers no open call"
            pending.remove(m["tool_call_id"])
            continue
        if pending:
            return f"message {i}: tool calls {pending} were not answered"
        if role not in ("system", "user", "assistant"):
            return f"message {i}: unknown role {role!r}"
        for c in m.get("tool_calls") or []:
            if not isinstance(c.get("function", {}).get("arguments"), str):
                return f"message {i}: function.arguments must be a string"
            pending.append(c["id"])
    if pending:
        return f"tool calls {pending} were not answered"
    return None


def _check_responses(headers: dict, body: dict, key: str | None) -> str | None:
    if _wrong_bearer(headers, key):
        return "missing or wrong Authorization bearer token"
    items = body.get("input")
    if isinstance(items, str):
        return None
    if not isinstance(items, list) or not items:
        return "input must be a string or a non-empty list of items"
    for tool in body.get("tools", []):
        if tool.get("type") != "function" or "name" not in tool:
            return "each tool needs type function and name"
    calls: set[str] = set()
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "function_call":
            if not isinstance(item.get("arguments"), str) or not item.get("call_id"):
                return f"input {i}: function_call needs call_id and arguments (a string)"
            calls.add(item["call_id"])
        elif kind == "function_call_output":
            if item.get("call_id") not in calls:
                return f"input {i}: function_call_output {item.get('call_id')} answers no function_call"
            calls.discard(item["call_id"])
        elif kind == "message":
            if item.get("role") not in ("user", "assistant", "system", "developer"):
                return f"input {i}: unknown role {item.get('role')!r}"
        else:
            return f"input {i}: unknown item type {kind!r}"
    if calls:
        return f"function calls {sorted(calls)} were not answered"
    return None


def _usage(step: dict) -> tuple[int, int, int]:
    u = step.get("usage") or {}
    return int(u.get("input", 100)), int(u.get("output", 50)), int(u.get("cached", 0))


def _render_anthropic(step: dict, model: str, next_id) -> dict:
    content: list[dict] = []
    if step.get("text"):
        content.append({"type": "text", "text": step["text"]})
    for call in step.get("tool_calls", []):
        content.append({"type": "tool_use", "id": next_id("toolu"), "name": call["name"],
                        "input": call["raw"] if "raw" in call else call.get("input", {})})
    i, o, c = _usage(step)
    return {"id": next_id("msg"), "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": "tool_use" if step.get("tool_calls") else "end_turn",
            "stop_sequence": None, "usage": {"input_tokens": i, "output_tokens": o,
                                             "cache_read_input_tokens": c,
                                             "cache_creation_input_tokens": 0}}


def _render_openai(step: dict, model: str, next_id) -> dict:
    msg: dict = {"role": "assistant", "content": step.get("text") or None}
    calls = [{"id": next_id("call"), "type": "function",
              "function": {"name": c["name"],
                           "arguments": c["raw"] if "raw" in c else json.dumps(c.get("input", {}))}}
             for c in step.get("tool_calls", [])]
    if calls:
        msg["tool_calls"] = calls
    i, o, c = _usage(step)
    return {"id": next_id("chatcmpl"), "object": "chat.completion", "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": msg, "logprobs": None,
                         "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": {"prompt_tokens": i + c, "completion_tokens": o, "total_tokens": i + c + o,
                      "prompt_tokens_details": {"cached_tokens": c}}}


def _render_responses(step: dict, model: str, next_id) -> dict:
    output: list[dict] = []
    if step.get("text"):
        output.append({"type": "message", "id": next_id("msg"), "role": "assistant", "status": "completed",
                       "content": [{"type": "output_text", "text": step["text"], "annotations": []}]})
    for call in step.get("tool_calls", []):
        output.append({"type": "function_call", "id": next_id("fc"), "call_id": next_id("call"),
                       "name": call["name"], "status": "completed",
                       "arguments": call["raw"] if "raw" in call else json.dumps(call.get("input", {}))})
    i, o, c = _usage(step)
    return {"id": next_id("resp"), "object": "response", "created_at": int(time.time()), "model": model,
            "status": "completed", "output": output, "parallel_tool_calls": True, "tool_choice": "auto",
            "tools": [], "error": None, "incomplete_details": None, "instructions": None, "metadata": {},
            "temperature": 1.0, "top_p": 1.0,
            "usage": {"input_tokens": i + c, "output_tokens": o, "total_tokens": i + c + o,
                      "input_tokens_details": {"cached_tokens": c},
                      "output_tokens_details": {"reasoning_tokens": 0}}}


_CHECKS = {"anthropic": _check_anthropic, "openai": _check_openai, "responses": _check_responses}
_RENDER = {"anthropic": _render_anthropic, "openai": _render_openai, "responses": _render_responses}
