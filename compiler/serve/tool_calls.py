"""Tool calling in ``tkcc serve``'s ``/v1/chat/completions``: the request's ``tools`` and ``tool_choice``
into the prompt, the generated text back into OpenAI ``tool_calls``.

Prompt: a chat template that knows tools (its source uses ``tools``, as HF templates with a tool
section do) renders them itself (``render_chat(..., tools=...)``); one that does not (SmolLM2's, plain
ChatML) gets a system text listing the tools as JSON and the call format of Hermes-style models
(vLLM's ``hermes`` tool parser reads the same)::

    <tool_call>
    {"name": "read_op", "arguments": {"name": "silu_and_mul"}}
    </tool_call>

An assistant message's earlier ``tool_calls`` are rendered back in that format, ``role: tool`` results as
``<tool_response>`` blocks in a user turn. ``tool_choice``: "auto" (default), "none" (no tools in the
prompt, no parsing), "required" or a named function: the answer is begun for the model
(``<tool_call>`` and, for a named function, ``{"name": "X", "arguments": ``), as a prefix it continues.

Parsing (:func:`parse_tool_calls`): ``<tool_call>...</tool_call>`` blocks (the last one may lack its
closing tag when the tokens ran out), else a bare JSON object ``{"name", "arguments"}`` (or a list of
them, optionally in a Markdown code fence). ``arguments`` may also be called ``parameters`` (Llama 3's
JSON format); a string value is passed on as given. What does not parse stays plain ``content``:
a small model's broken call reaches the client as text, as from any OpenAI-compatible server.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from compiler.serve.validation import ApiError

__all__ = ["ToolRequest", "parse_tool_request", "template_messages", "parse_tool_calls", "tool_system_text"]

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*(?:```)?$", re.S)
_DECODER = json.JSONDecoder(strict=False)       # a model's JSON strings hold raw newlines (kernel sources)


@dataclass(frozen=True)
class ToolRequest:
    """The request's functions (``{"name", "description", "parameters"}`` each) and ``tool_choice``:
    "auto", "none", "required" or the one function's name."""

    tools: tuple[dict, ...]
    choice: str = "auto"

    @property
    def active(self) -> bool:
        return bool(self.tools) and self.choice != "none"

    def prefix(self) -> str:
        """The start of the answer written for the model (after the generation prompt)."""
        if not self.active or self.choice == "auto":
            return ""
        if self.choice == "required":
            return "<tool_call>\n"
        return '<tool_call>\n{"name": ' + json.dumps(self.choice) + ', "arguments": '


def parse_tool_request(body: dict) -> ToolRequest | None:
    """``tools`` and ``tool_choice`` of a chat request, checked (ApiError naming the parameter); None
    without tools."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            raise ApiError("'tool_choice' needs 'tools'", "tool_choice")
        return None
    if not isinstance(tools, list):
        raise ApiError("'tools' must be a list of function tools", "tools")
    out = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) and t.get("type") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not _NAME.match(fn["name"]):
            raise ApiError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}} with a name of "
                           "letters, digits, _ or - (at most 64)", f"tools[{i}]")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise ApiError(f"tools[{i}].function.parameters must be a JSON schema object",
                           f"tools[{i}].function.parameters")
        desc = fn.get("description") or ""
        if not isinstance(desc, str):
            raise ApiError(f"tools[{i}].function.description must be a string", f"tools[{i}].function.description")
        out.append({"name": fn["name"], "description": desc, "parameters": params})
    names = {t["name"] for t in out}
    if choice is None or choice in ("auto", "none", "required"):
        return ToolRequest(tuple(out), choice or "auto")
    named = choice.get("function", {}).get("name") if isinstance(choice, dict) and choice.get("type") == "function" \
        and isinstance(choice.get("function"), dict) else None
    if named not in names:
        raise ApiError("'tool_choice' must be none, auto, required or {'type': 'function', 'function': {'name': N}} "
                       f"with N one of the tools ({', '.join(sorted(names))})", "tool_choice")
    return ToolRequest(tuple(out), named)


def tool_system_text(req: ToolRequest) -> str:
    """The tools and the call format, for a chat template without a tool section."""
    lines = "\n".join(json.dumps(t, separators=(",", ":")) for t in req.tools)
    must = "You must call a function." if req.choice != "auto" else \
        "Call a function when it helps; otherwise answer in plain text."
    return ("You can call functions. Their signatures, as JSON schemas:\n<tools>\n" + lines + "\n</tools>\n"
            "To call one, answer with a JSON object inside <tool_call></tool_call> tags:\n"
            '<tool_call>\n{"name": <function-name>, "arguments": <arguments-json-object>}\n</tool_call>\n' + must)


def _call_text(call: Any, where: str) -> str:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ApiError(f"{where} must be {{'type': 'function', 'function': {{'name', 'arguments'}}}}", where)
    args = fn.get("arguments", "{}")
    try:
        args = _DECODER.decode(args) if isinstance(args, str) else args
    except ValueError:
        pass                                          # a model's earlier broken arguments, shown as they were
    return "<tool_call>\n" + json.dumps({"name": fn["name"], "arguments": args}) + "\n</tool_call>"


def template_messages(messages: list[dict], req: ToolRequest | None, native: bool) -> list[dict]:
    """``messages`` (validated: role, content, and an assistant's ``tool_calls``) as role/content pairs
    for a chat template: tool calls and results in the Hermes text format, the tool listing in the system
    message unless the template renders tools itself (``native``)."""
    out: list[dict] = []
    for i, m in enumerate(messages):
        if m["role"] == "tool":
            block = f"<tool_response>\n{m['content']}\n</tool_response>"
            if out and out[-1].get("tool_results"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "tool_results": True})
            continue
        content = m["content"]
        calls = m.get("tool_calls") or []
        if not isinstance(calls, list):
            raise ApiError(f"messages[{i}].tool_calls must be a list", f"messages[{i}].tool_calls")
        texts = [_call_text(c, f"messages[{i}].tool_calls[{j}]") for j, c in enumerate(calls)]
        out.append({"role": m["role"], "content": "\n".join(([content] if content else []) + texts)})
    out = [{"role": m["role"], "content": m["content"]} for m in out]
    if req is not None and req.active and not native:
        text = tool_system_text(req)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + text}
        else:
            out.insert(0, {"role": "system", "content": text})
    return out


def _as_call(obj: Any) -> dict | None:
    """An OpenAI tool call from a parsed ``{"name", "arguments"}`` object, or None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
            "function": {"name": obj["name"], "arguments": args if isinstance(args, str) else json.dumps(args)}}


def _json_calls(text: str) -> tuple[list[dict], str] | None:
    """Calls from JSON at the start of ``text`` (an object or a list of them) and the text after it."""
    text = _FENCE.sub(r"\1", text.strip()) if text.strip().startswith("```") else text.strip()
    if not text.startswith(("{", "[")):
        return None
    try:
        obj, end = _DECODER.raw_decode(text)
    except ValueError:
        return None
    objs = obj if isinstance(obj, list) else [obj]
    calls = [_as_call(o) for o in objs]
    if not calls or any(c is None for c in calls):
        return None
    return calls, text[end:].strip()


def parse_tool_calls(text: str) -> tuple[str | None, list[dict]]:
    """(content, tool_calls) of a generated answer: see the module docstring. Content is None when the
    answer was calls alone."""
    blocks = list(_BLOCK.finditer(text))
    if not blocks:
        found = _json_calls(text)
        if found is None:
            return text, []
        return found[1] or None, found[0]
    calls, rest, pos = [], [], 0
    for b in blocks:
        found = _json_calls(b.group(1))
        if found is None or found[1]:
            continue                                  # broken: stays in the content, as written
        rest.append(text[pos:b.start()])
        pos = b.end()
        calls += found[0]
    rest.append(text[pos:])
    content = "".join(rest).strip()
    return (content or None) if calls else text, calls
