"""LLM agents through the official SDKs: Anthropic (Messages API) and OpenAI (Responses API or chat
completions; any OpenAI-compatible server through ``base_url``)."""

from agents.llm.agent import AnthropicAgent, ChatModel, LLMAgent, LLMBudget, OpenAIAgent, SharedSpend
from agents.llm.anthropic import AnthropicChat, AnthropicConfig
from agents.llm.messages import (LLMError, LLMReply, MalformedToolCalls, Message,
                                 MissingKeyError, TokenCount, ToolCall, ToolResult,
                                 ToolSpec)
from agents.llm.openai import OpenAIChat, OpenAIConfig
from agents.llm.tools import RESULT_CHARS, TOOLS, ToolBox

__all__ = ["AnthropicAgent", "AnthropicChat", "AnthropicConfig", "ChatModel", "LLMAgent", "LLMBudget",
           "LLMError", "LLMReply", "MalformedToolCalls", "Message", "MissingKeyError", "OpenAIAgent", "OpenAIChat",
           "OpenAIConfig", "RESULT_CHARS", "SharedSpend", "TOOLS", "TokenCount", "ToolBox", "ToolCall", "ToolResult",
           "ToolSpec"]
