"""The OpenAI chat-completions client (and any compatible base_url) against the scripted server."""

import json

import pytest

from agents.llm import (LLMError, Message, MissingKeyError, OpenAIChat, OpenAIConfig, RetryPolicy,
                        TOOLS, ToolResult)
from agents.testing import ScriptedLLMServer

FAST = RetryPolicy(max_retries=3, base_s=0.01, cap_s=0.05, timeout_s=10)


def _chat(srv, key="test-key", **cfg):
    return OpenAIChat(OpenAIConfig(model="m", base_url=srv.url + "/v1", retry=FAST, **cfg), api_key=key)


def test_round_trip_with_tool_messages_and_usage():
    script = [{"tool_calls": [{"name": "post_idea", "input": {"title": "t", "body": "b",
                                                              "target": "rms_norm"}}],
               "usage": {"input": 900, "output": 80}},
              {"text": "learned x", "expect": ["IDEA-7"]}]
    with ScriptedLLMServer({"m": script}) as srv:
        chat = _chat(srv)
        msgs = [Message("user", "go")]
        r1 = chat.complete("sys", msgs, list(TOOLS))
        assert r1.stop_reason == "tool_calls" and r1.text == ""
        assert r1.tool_calls[0].arguments == {"title": "t", "body": "b", "target": "rms_norm"}
        assert (r1.tokens.input_tokens, r1.tokens.output_tokens) == (900, 80)
        msgs += [r1.as_message(), Message("user", tool_results=(ToolResult(r1.tool_calls[0].id,
                                                                           "IDEA-7"),))]
        r2 = chat.complete("sys", msgs, list(TOOLS))
        assert r2.text == "learned x" and r2.stop_reason == "stop"
        assert srv.protocol_errors == []
        sent = srv.requests[-1].body["messages"]
        assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool"]
        assert json.loads(sent[2]["tool_calls"][0]["function"]["arguments"])["target"] == "rms_norm"
        assert srv.requests[-1].body["tools"][0]["type"] == "function"


@pytest.mark.parametrize("fault", [429, 500, 503, "malformed"])
def test_transient_faults_are_retried(fault):
    with ScriptedLLMServer({"m": [{"fault": fault, "times": 3}, {"text": "fine"}]}) as srv:
        assert _chat(srv).complete("sys", [Message("user", "go")], list(TOOLS)).text == "fine"
        assert len(srv.requests) == 4


def test_persistent_500_gives_up():
    with ScriptedLLMServer({"m": [{"fault": 500, "times": 9}]}) as srv:
        with pytest.raises(LLMError) as err:
            _chat(srv).complete("sys", [Message("user", "go")], list(TOOLS))
        assert err.value.status == 500 and err.value.attempts == 4 and "500" in str(err.value)


def test_bad_json_arguments_are_kept_raw_for_the_history():
    script = [{"tool_calls": [{"name": "submit_candidate", "raw": "{\"source\": \"import tor"}]},
              {"text": "ok", "expect": ["malformed"]}]
    with ScriptedLLMServer({"m": script}) as srv:
        chat = _chat(srv)
        r = chat.complete("sys", [Message("user", "go")], list(TOOLS))
        call = r.tool_calls[0]
        assert call.arguments is None and "not valid JSON" in call.error
        msgs = [Message("user", "go"), r.as_message(),
                Message("user", tool_results=(ToolResult(call.id, "malformed tool call", True),))]
        assert chat.complete("sys", msgs, list(TOOLS)).text == "ok"
        sent = srv.requests[-1].body["messages"][2]["tool_calls"][0]["function"]["arguments"]
        assert sent == "{\"source\": \"import tor"


def test_compatible_server_without_key():
    with ScriptedLLMServer({"local": [{"text": "hello"}]}, api_key=None) as srv:
        chat = OpenAIChat(OpenAIConfig(model="local", base_url=srv.url + "/v1/", require_key=False,
                                       retry=FAST), api_key="")
        assert chat.complete("s", [Message("user", "go")], list(TOOLS)).text == "hello"
        assert "authorization" not in chat._headers


def test_missing_key_is_a_user_error_and_the_endpoint_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(MissingKeyError, match="OPENAI_API_KEY") as err:
        OpenAIChat()
    assert err.value.user_error is True
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1")
    monkeypatch.setenv("TKCC_OPENAI_MODEL", "qwen3-local")
    chat = OpenAIChat()                  # a local compatible server: no key needed
    assert chat.url == "http://127.0.0.1:8000/v1/chat/completions" and chat.model == "qwen3-local"


def test_reasoning_models_get_max_completion_tokens():
    from agents.llm.openai import to_wire
    msgs = [Message("user", "go")]
    assert "max_completion_tokens" in to_wire("s", msgs, [], OpenAIConfig(model="o3", max_tokens=9))
    body = to_wire("s", msgs, [], OpenAIConfig(model="qwen3-30b", max_tokens=9))
    assert body["max_tokens"] == 9 and "max_completion_tokens" not in body
