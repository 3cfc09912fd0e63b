"""The OpenAI agent's model through the real ``openai`` SDK client against the scripted server: the
Responses API, chat completions, the automatic fallback for servers without /v1/responses, SDK retries
and timeouts, malformed arguments kept raw for the history, compatible servers without a key."""

import json

import pytest

from agents.llm import LLMError, Message, MissingKeyError, OpenAIChat, OpenAIConfig, TOOLS, ToolResult
from agents.testing import ScriptedLLMServer

IDEA = {"tool_calls": [{"name": "post_idea", "input": {"title": "t", "body": "b", "target": "rms_norm"}}],
        "usage": {"input": 900, "output": 80, "cached": 100}}


def _chat(srv, key="test-key", **cfg):
    cfg = {"max_retries": 3, "timeout_s": 10, **cfg}
    return OpenAIChat(OpenAIConfig(model="m", base_url=srv.url + "/v1", **cfg), api_key=key)


def _round_trip(chat):
    msgs = [Message("user", "go")]
    r1 = chat.complete("sys", msgs, list(TOOLS))
    assert r1.stop_reason == "tool_calls" and r1.text == ""
    assert r1.tool_calls[0].arguments == {"title": "t", "body": "b", "target": "rms_norm"}
    assert (r1.tokens.input_tokens, r1.tokens.output_tokens, r1.tokens.cache_read_tokens) == (900, 80, 100)
    msgs += [r1.as_message(), Message("user", tool_results=(ToolResult(r1.tool_calls[0].id, "IDEA-7"),))]
    return chat.complete("sys", msgs, list(TOOLS))


def test_chat_completions_round_trip():
    with ScriptedLLMServer({"m": [IDEA, {"text": "learned x", "expect": ["IDEA-7"]}]}) as srv:
        r2 = _round_trip(_chat(srv, api="chat"))
        assert r2.text == "learned x" and r2.stop_reason == "stop" and srv.protocol_errors == []
        sent = srv.requests[-1].body["messages"]
        assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool"]
        assert json.loads(sent[2]["tool_calls"][0]["function"]["arguments"])["target"] == "rms_norm"
        assert srv.requests[-1].path == "/v1/chat/completions"


def test_responses_api_round_trip():
    with ScriptedLLMServer({"m": [IDEA, {"text": "learned y", "expect": ["IDEA-7"]}]}) as srv:
        chat = _chat(srv)                           # api="auto": Responses first
        r2 = _round_trip(chat)
        assert r2.text == "learned y" and chat.api == "responses" and srv.protocol_errors == []
        body = srv.requests[-1].body
        assert srv.requests[-1].path == "/v1/responses" and body["instructions"] == "sys" and body["store"] is False
        kinds = [i.get("type", "message") for i in body["input"]]
        assert kinds == ["message", "function_call", "function_call_output"]
        assert body["tools"][0]["type"] == "function" and "parameters" in body["tools"][0]


def test_auto_falls_back_to_chat_completions_when_the_server_lacks_responses():
    with ScriptedLLMServer({"m": [IDEA, {"text": "z", "expect": ["IDEA-7"]}]}, responses_api=False) as srv:
        chat = _chat(srv)
        assert _round_trip(chat).text == "z" and chat.api == "chat"
        assert [r.path for r in srv.requests] == ["/v1/responses", "/v1/chat/completions", "/v1/chat/completions"]


@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize("fault", [429, 500, 503, "malformed"])
def test_transient_faults_are_retried(api, fault):
    with ScriptedLLMServer({"m": [{"fault": fault, "times": 3}, {"text": "fine"}]}) as srv:
        assert _chat(srv, api=api).complete("sys", [Message("user", "go")], list(TOOLS)).text == "fine"
        assert len(srv.requests) == 4


def test_persistent_500_gives_up():
    with ScriptedLLMServer({"m": [{"fault": 500, "times": 9}]}) as srv:
        with pytest.raises(LLMError) as err:
            _chat(srv, api="chat").complete("sys", [Message("user", "go")], list(TOOLS))
        assert err.value.status == 500 and err.value.attempts == 4 and "HTTP 500" in str(err.value)


def test_a_slow_answer_times_out_and_is_retried():
    with ScriptedLLMServer({"m": [{"text": "late", "delay_s": 1.5}, {"text": "in time"}]}) as srv:
        chat = _chat(srv, api="responses", timeout_s=0.5, max_retries=1)
        assert chat.complete("sys", [Message("user", "go")], list(TOOLS)).text == "in time"


def test_bad_json_arguments_are_kept_raw_for_the_history():
    script = [{"tool_calls": [{"name": "submit_candidate", "raw": "{\"source\": \"import tor"}]},
              {"text": "ok", "expect": ["malformed"]}]
    with ScriptedLLMServer({"m": script}) as srv:
        chat = _chat(srv, api="chat")
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
        chat = OpenAIChat(OpenAIConfig(model="local", base_url=srv.url + "/v1/", require_key=False), api_key="")
        assert chat.complete("s", [Message("user", "go")], list(TOOLS)).text == "hello"


def test_missing_key_is_a_user_error_and_the_endpoint_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(MissingKeyError, match="OPENAI_API_KEY") as err:
        OpenAIChat()
    assert err.value.user_error is True
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1")
    monkeypatch.setenv("TKCC_OPENAI_MODEL", "qwen3-local")
    chat = OpenAIChat()                  # a local compatible server: no key needed
    assert str(chat._client.base_url).rstrip("/") == "http://127.0.0.1:8000/v1" and chat.model == "qwen3-local"


def test_reasoning_models_get_max_completion_tokens():
    with ScriptedLLMServer({"o3": [{"text": "a"}], "qwen3-30b": [{"text": "b"}]}) as srv:
        for model, key in (("o3", "max_completion_tokens"), ("qwen3-30b", "max_tokens")):
            OpenAIChat(OpenAIConfig(model=model, base_url=srv.url + "/v1", api="chat", max_tokens=9),
                       api_key="test-key").complete("s", [Message("user", "go")], [])
            body = srv.requests[-1].body
            assert body[key] == 9 and len({"max_tokens", "max_completion_tokens"} & set(body)) == 1


def test_small_local_models_get_a_token_bound_and_may_be_held_to_tools(monkeypatch):
    monkeypatch.setenv("TKCC_OPENAI_MAX_TOKENS", "24")
    monkeypatch.setenv("TKCC_OPENAI_TOOL_CHOICE", "required")
    with ScriptedLLMServer({"smol": [{"text": "a"}, {"text": "b"}]}) as srv:
        for api in ("chat", "responses"):
            OpenAIChat(OpenAIConfig(model="smol", base_url=srv.url + "/v1", api=api),
                       api_key="test-key").complete("s", [Message("user", "go")], [])
            body = srv.requests[-1].body
            assert body["tool_choice"] == "required" and body.get("max_tokens", body.get("max_output_tokens")) == 24
    monkeypatch.setenv("TKCC_OPENAI_MAX_TOKENS", "lots")
    with pytest.raises(ValueError, match="TKCC_OPENAI_MAX_TOKENS must be a positive integer") as err:
        OpenAIConfig()
    assert err.value.user_error is True
    monkeypatch.setenv("TKCC_OPENAI_MAX_TOKENS", "8")
    monkeypatch.setenv("TKCC_OPENAI_TOOL_CHOICE", "always")
    with pytest.raises(ValueError, match="TKCC_OPENAI_TOOL_CHOICE must be one of auto, required"):
        OpenAIConfig()
