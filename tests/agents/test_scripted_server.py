"""The scripted LLM server: real HTTP on 127.0.0.1, the three wire formats, faults, delays, per-agent
scripts, protocol checks."""

import json

import httpx
import pytest

from agents.testing import ScriptedLLMServer

KEY = "test-key"
A_HEADERS = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
O_HEADERS = {"authorization": f"Bearer {KEY}"}
STEP = {"text": "hi", "tool_calls": [{"name": "read_op", "input": {"name": "rms_norm"}}],
        "usage": {"input": 11, "output": 7}}


def _anthropic(url, messages, model="m"):
    return httpx.post(f"{url}/v1/messages", headers=A_HEADERS,
                      json={"model": model, "max_tokens": 100, "messages": messages})


def _openai(url, messages, model="m"):
    return httpx.post(f"{url}/v1/chat/completions", headers=O_HEADERS,
                      json={"model": model, "messages": messages})


def test_renders_one_step_in_both_wire_formats():
    with ScriptedLLMServer({"m": [STEP, STEP]}) as srv:
        assert srv.url.startswith("http://127.0.0.1:")
        a = _anthropic(srv.url, [{"role": "user", "content": "go"}]).json()
        assert a["type"] == "message" and a["stop_reason"] == "tool_use"
        assert a["content"][0] == {"type": "text", "text": "hi"}
        use = a["content"][1]
        assert use["type"] == "tool_use" and use["input"] == {"name": "rms_norm"}
        assert a["usage"]["input_tokens"] == 11 and a["usage"]["output_tokens"] == 7
        o = _openai(srv.url, [{"role": "user", "content": "go"}]).json()
        call = o["choices"][0]["message"]["tool_calls"][0]
        assert o["choices"][0]["finish_reason"] == "tool_calls"
        assert json.loads(call["function"]["arguments"]) == {"name": "rms_norm"}
        assert o["usage"]["prompt_tokens"] == 11 and o["usage"]["completion_tokens"] == 7
        assert srv.remaining("m") == 0
        # used up: a plain closing text
        done = _openai(srv.url, [{"role": "user", "content": "go"}]).json()
        assert done["choices"][0]["finish_reason"] == "stop"
        assert srv.protocol_errors == []


def test_faults_are_served_in_order_with_retry_after():
    script = [{"fault": 429, "times": 2, "retry_after": 0}, {"fault": 500}, {"fault": "malformed"},
              {"text": "ok"}]
    with ScriptedLLMServer({"m": script}) as srv:
        msgs = [{"role": "user", "content": "go"}]
        r = [_anthropic(srv.url, msgs) for _ in range(5)]
        assert [x.status_code for x in r] == [429, 429, 500, 200, 200]
        assert r[0].headers["retry-after"] == "0"
        with pytest.raises(ValueError):
            json.loads(r[3].text)
        assert r[4].json()["content"][0]["text"] == "ok"


@pytest.mark.parametrize("headers,body,needle", [
    ({}, {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}, "API key"),
    (A_HEADERS, {"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    (A_HEADERS, {"model": "m", "max_tokens": 5, "messages": [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "a", "input": {}}]},
        {"role": "user", "content": [{"type": "text", "text": "no result"}]}]}, "do not answer"),
])
def test_anthropic_protocol_violations_are_400(headers, body, needle):
    with ScriptedLLMServer({"m": [STEP]}) as srv:
        r = httpx.post(f"{srv.url}/v1/messages", headers=headers, json=body)
        assert r.status_code == 400 and needle in r.text
        assert len(srv.protocol_errors) == 1 and srv.remaining("m") == 1


def test_openai_unanswered_tool_call_is_400_and_expect_checks_last_message():
    call = {"id": "c1", "type": "function", "function": {"name": "a", "arguments": "{}"}}
    with ScriptedLLMServer({"m": [{"text": "x", "expect": ["VERDICT-42"]}]}) as srv:
        bad = _openai(srv.url, [{"role": "user", "content": "x"},
                                {"role": "assistant", "content": None, "tool_calls": [call]},
                                {"role": "user", "content": "forgot the tool message"}])
        assert bad.status_code == 400 and "not answered" in bad.text
        wrong = _openai(srv.url, [{"role": "user", "content": "x"},
                                  {"role": "assistant", "content": None, "tool_calls": [call]},
                                  {"role": "tool", "tool_call_id": "c1", "content": "VERDICT-41"}])
        assert wrong.status_code == 400 and "VERDICT-42" in wrong.text
        good = _openai(srv.url, [{"role": "user", "content": "x"},
                                 {"role": "assistant", "content": None, "tool_calls": [call]},
                                 {"role": "tool", "tool_call_id": "c1", "content": "VERDICT-42"}])
        assert good.status_code == 200 and good.json()["choices"][0]["message"]["content"] == "x"
        assert httpx.post(f"{srv.url}/v1/other", json={}).status_code == 404


def test_responses_format_per_agent_scripts_and_delays():
    import time

    scripts = {"m": [{"text": "shared"}], "m@agent-b": [{"text": "mine", "delay_s": 0.3}, STEP]}
    with ScriptedLLMServer(scripts) as srv:
        body = {"model": "m", "input": [{"role": "user", "content": "go"}]}
        t0 = time.monotonic()
        r = httpx.post(f"{srv.url}/v1/responses", headers={**O_HEADERS, "x-tkcc-agent": "agent-b"}, json=body)
        assert time.monotonic() - t0 >= 0.3
        out = r.json()
        assert out["object"] == "response" and out["output"][0]["content"][0]["text"] == "mine"
        r = httpx.post(f"{srv.url}/v1/responses", headers={**O_HEADERS, "x-tkcc-agent": "agent-b"}, json=body)
        call = [i for i in r.json()["output"] if i["type"] == "function_call"][0]
        assert json.loads(call["arguments"]) == {"name": "rms_norm"} and call["call_id"]
        other = httpx.post(f"{srv.url}/v1/responses", headers=O_HEADERS, json=body).json()
        assert other["output"][0]["content"][0]["text"] == "shared"
        unanswered = dict(body, input=body["input"] + [{"type": "function_call", "call_id": "c9", "name": "a",
                                                         "arguments": "{}"}])
        bad = httpx.post(f"{srv.url}/v1/responses", headers=O_HEADERS, json=unanswered)
        assert bad.status_code == 400 and "not answered" in bad.text
    with ScriptedLLMServer({"m": [STEP]}, responses_api=False) as srv:
        assert httpx.post(f"{srv.url}/v1/responses", headers=O_HEADERS, json=body).status_code == 404
