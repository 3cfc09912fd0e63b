"""LLM agents (Anthropic Messages API, OpenAI chat completions and compatible servers) over httpx."""

from agents.llm.agent import AnthropicAgent, ChatModel, LLMAgent, LLMBudget, OpenAIAgent
from agents.llm.anthropic import AnthropicChat, AnthropicConfig
from agents.llm.http import RetryPolicy
from agents.llm.messages import (LLMError, LLMReply, MalformedToolCalls, Message,
                                 MissingKeyError, ToolCall, ToolResult,
                                 ToolSpec)
from agents.llm.openai import OpenAIChat, OpenAIConfig
from agents.llm.tools import TOOLS, ToolBox

__all__ = ["AnthropicAgent", "AnthropicChat", "AnthropicConfig", "ChatModel", "LLMAgent", "LLMBudget",
           "LLMError", "LLMReply", "MalformedToolCalls", "Message", "MissingKeyError", "OpenAIAgent", "OpenAIChat",
           "OpenAIConfig", "RetryPolicy", "TOOLS", "ToolBox", "ToolCall", "ToolResult", "ToolSpec"]
