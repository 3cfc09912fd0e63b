"""The Anthropic agent's model through the real ``anthropic`` SDK client against the scripted server:
requests with prompt caching, tool use round trips, SDK retries (429 with retry-after, 500, 529,
timeouts), malformed bodies retried by the agent's layer, malformed tool calls parsed with an error."""

import time

import pytest

from agents.llm import (AnthropicAgent, AnthropicChat, AnthropicConfig, LLMError, Message,
                        MissingKeyError, TOOLS, ToolResult)
from agents.testing import ScriptedLLMServer


def _chat(srv, key="test-key", **cfg):
    cfg = {"max_retries": 3, "timeout_s": 10, **cfg}
    return AnthropicChat(AnthropicConfig(model="m", base_url=srv.url, **cfg), api_key=key)


def test_round_trip_with_tool_results_cache_breakpoints_and_usage():
    script = [{"text": "look", "tool_calls": [{"name": "read_op", "input": {"name": "rms_norm"}},
                                             {"name": "read_profile", "input": {}}],
               "usage": {"input": 120, "output": 30, "cached": 2000}},
              {"text": "done", "expect": ["SIG-rms", "PROFILE-ok"]}]
    with ScriptedLLMServer({"m": script}) as srv:
        chat = _chat(srv)
        msgs = [Message("user", "go")]
        r1 = chat.complete("sys", msgs, list(TOOLS))
        assert r1.stop_reason == "tool_use" and r1.text == "look"
        assert [c.name for c in r1.tool_calls] == ["read_op", "read_profile"]
        assert r1.tool_calls[0].arguments == {"name": "rms_norm"} and r1.tool_calls[0].error is None
        assert (r1.tokens.input_tokens, r1.tokens.output_tokens, r1.tokens.cache_read_tokens) == (120, 30, 2000)
        msgs += [r1.as_message(), Message("user", tool_results=(
            ToolResult(r1.tool_calls[0].id, "SIG-rms"), ToolResult(r1.tool_calls[1].id, "PROFILE-ok")))]
        r2 = chat.complete("sys", msgs, list(TOOLS))
        assert r2.text == "done" and r2.tool_calls == () and r2.stop_reason == "end_turn"
        assert srv.protocol_errors == []
        body = srv.requests[-1].body
        # the stable prefix (tools + system) and the conversation so far are cache breakpoints
        assert body["system"] == [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}]
        assert body["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
        assert {t["name"] for t in body["tools"]} == {t.name for t in TOOLS}
        assert body["messages"][2]["content"][0]["type"] == "tool_result"


@pytest.mark.parametrize("fault", [429, 500, 529, "malformed"])
def test_transient_faults_are_retried(fault):
    with ScriptedLLMServer({"m": [{"fault": fault, "times": 2}, {"text": "fine"}]}) as srv:
        r = _chat(srv).complete("sys", [Message("user", "go")], list(TOOLS))
        assert r.text == "fine" and len(srv.requests) == 3


def test_429_retry_after_is_honoured_by_the_sdk():
    with ScriptedLLMServer({"m": [{"fault": 429, "retry_after": 0.4}, {"text": "fine"}]}) as srv:
        t0 = time.monotonic()
        assert _chat(srv).complete("sys", [Message("user", "go")], list(TOOLS)).text == "fine"
        assert time.monotonic() - t0 >= 0.4 and [r.status for r in srv.requests] == [429, 200]


def test_persistent_429_gives_up_after_max_retries():
    with ScriptedLLMServer({"m": [{"fault": 429, "times": 10}]}) as srv:
        with pytest.raises(LLMError) as err:
            _chat(srv).complete("sys", [Message("user", "go")], list(TOOLS))
        assert err.value.status == 429 and err.value.attempts == 4 and len(srv.requests) == 4
        assert "HTTP 429 after 4 attempts" in str(err.value)


def test_a_slow_answer_times_out_and_is_retried():
    script = [{"text": "late", "delay_s": 1.5}, {"text": "in time"}]
    with ScriptedLLMServer({"m": script}) as srv:
        r = _chat(srv, timeout_s=0.5, max_retries=1).complete("sys", [Message("user", "go")], list(TOOLS))
        assert r.text == "in time"
    with ScriptedLLMServer({"m": [{"text": "late", "delay_s": 1.0, "times": 2}]}) as srv:
        with pytest.raises(LLMError, match="timed out after 2 attempts"):
            _chat(srv, timeout_s=0.3, max_retries=1).complete("sys", [Message("user", "go")], list(TOOLS))


def test_wrong_key_is_not_retried():
    with ScriptedLLMServer({"m": [{"text": "never"}]}) as srv:
        with pytest.raises(LLMError) as err:
            _chat(srv, key="wrong").complete("sys", [Message("user", "go")], list(TOOLS))
        assert err.value.status == 400 and "API key" in str(err.value) and len(srv.requests) == 1


def test_malformed_tool_calls_are_parsed_with_an_error():
    script = [{"tool_calls": [{"name": "read_op", "raw": "{not an object"},
                              {"name": "no_such_tool", "input": {}},
                              {"name": "read_op", "input": {"nam": "x"}}]}]
    with ScriptedLLMServer({"m": script}) as srv:
        r = _chat(srv).complete("sys", [Message("user", "go")], list(TOOLS))
        errors = [c.error for c in r.tool_calls]
        assert all(c.arguments is None for c in r.tool_calls)
        assert "JSON object" in errors[0] and "unknown tool" in errors[1] and "needs argument" in errors[2]


def test_missing_key_is_a_user_error_and_the_model_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(MissingKeyError, match="ANTHROPIC_API_KEY") as err:
        AnthropicChat()
    assert err.value.user_error is True
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    monkeypatch.setenv("TKCC_ANTHROPIC_MODEL", "claude-opus-4-1")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")
    agent = AnthropicAgent("c")
    assert agent.chat.model == "claude-opus-4-1" and agent.price == (15.0, 75.0) and agent.kind == "llm"
    assert str(agent.chat._client.base_url).startswith("http://127.0.0.1:9")
