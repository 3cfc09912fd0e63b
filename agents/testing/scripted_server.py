"""A real HTTP server on 127.0.0.1 that speaks the Anthropic Messages API (``POST /v1/messages``)
and OpenAI chat completions (``POST /v1/chat/completions``), replaying recorded tool-call
conversations. No network, no key, deterministic: the LLM agents are tested against it.

A script is a list of steps, replayed in order per conversation key (the request's ``model``), each
step in a neutral form rendered into whichever wire format was asked:

- ``{"text": "...", "tool_calls": [{"name": "read_op", "input": {"name": "rms_norm"}}],
  "usage": {"input": 120, "output": 30}}``: one assistant turn (``tool_calls`` optional);
  a call may give ``"raw": "{not json"`` instead of ``input`` to send malformed arguments;
- ``{"fault": 429 | 500 | 503 | 529, "times": n}``: answer with that HTTP status n times
  (``retry_after`` optional);
- ``{"fault": "malformed", "times": n}``: 200 with a body that is not the expected JSON;
- ``"expect": ["substring", ...]`` on any step: the request's last message must contain each
  substring in one of its strings (e.g. a verdict the agent must have sent back), otherwise 400.

Every request is also checked against the wire format (auth header, required fields, every tool call
answered by a tool result in the next message); a violation is answered with HTTP 400 and recorded
in ``protocol_errors`` (``api_key=None`` skips the auth check, like a local server). A key whose
script is used up is answered with a plain closing text.
Fixtures are JSON files ``{"scripts": {model: [steps]}}``; :meth:`ScriptedLLMServer.from_fixture`.
"""

from __future__ import annotations

import json
import threading
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
                 host: str = "127.0.0.1", port: int = 0):
        self._queues: dict[str, list[dict]] = {m: self._expand(s) for m, s in scripts.items()}
        self.api_key = api_key
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
        fmt = {"/v1/messages": "anthropic", "/v1/chat/completions": "openai"}.get(path)
        if fmt is None:
            return self._record(path, "", 404, None, _err(f"no route {path}"))
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("body is not an object")
        except ValueError as exc:
            return self._record(path, "", 400, None, _err(f"invalid JSON: {exc}"), protocol=True)
        model = str(body.get("model", ""))
        problem = (_check_anthropic if fmt == "anthropic" else _check_openai)(headers, body,
                                                                             self.api_key)
        if problem:
            return self._record(path, model, 400, body, _err(problem), protocol=True)
        with self._lock:
            queue = self._queues.get(model) or [{"text": EXHAUSTED_TEXT}]
            step = queue[0]
            missing = [n for n in step.get("expect", [])
                       if n not in _text_of(_last_message(fmt, body))]
            if not missing and self._queues.get(model):
                queue.pop(0)
        if missing:  # the step stays queued: the client may retry with the right history
            return self._record(path, model, 400, body,
                                _err(f"expected {missing[0]!r} in the last message"), protocol=True)
        fault = step.get("fault")
        if fault == "malformed":
            return self._record(path, model, 200, body, "{\"choices\": [ {\"mess")
        if fault is not None:
            extra = {"retry-after": str(step["retry_after"])} if "retry_after" in step else {}
            return self._record(path, model, int(fault), body,
                                _err(f"scripted HTTP {fault}"), extra=extra)
        render = _render_anthropic if fmt == "anthropic" else _render_openai
        return self._record(path, model, 200, body, json.dumps(render(step, model, self._next_id)))

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
                self.send_header("content-length", str(len(data)))
                for k, v in extra.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:  # quiet
                return

        return Handler


def _err(message: str) -> str:
    return json.dumps({"type": "error", "error": {"type": "scripted_error", "message": message}})


def _last_message(fmt: str, body: dict) -> Any:
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


def _check_anthropic(headers: dict, body: dict, key: str | None) -> str | None:
    if key is not None and headers.get("x-api-key") != key:
        return "missing or wrong x-api-key"
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
    if key is not None and headers.get("authorization") != f"Bearer {key}":
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


def _usage(step: dict) -> tuple[int, int]:
    u = step.get("usage") or {}
    return int(u.get("input", 100)), int(u.get("output", 50))


def _render_anthropic(step: dict, model: str, next_id) -> dict:
    content: list[dict] = []
    if step.get("text"):
        content.append({"type": "text", "text": step["text"]})
    for call in step.get("tool_calls", []):
        content.append({"type": "tool_use", "id": next_id("toolu"), "name": call["name"],
                        "input": call["raw"] if "raw" in call else call.get("input", {})})
    i, o = _usage(step)
    return {"id": next_id("msg"), "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": "tool_use" if step.get("tool_calls") else "end_turn",
            "stop_sequence": None, "usage": {"input_tokens": i, "output_tokens": o}}


def _render_openai(step: dict, model: str, next_id) -> dict:
    msg: dict = {"role": "assistant", "content": step.get("text") or None}
    calls = [{"id": next_id("call"), "type": "function",
              "function": {"name": c["name"],
                           "arguments": c["raw"] if "raw" in c else json.dumps(c.get("input", {}))}}
             for c in step.get("tool_calls", [])]
    if calls:
        msg["tool_calls"] = calls
    i, o = _usage(step)
    return {"id": next_id("chatcmpl"), "object": "chat.completion", "model": model,
            "choices": [{"index": 0, "message": msg,
                         "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": {"prompt_tokens": i, "completion_tokens": o, "total_tokens": i + o}}
