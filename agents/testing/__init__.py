"""Test helpers shipped with the package: a scripted LLM server speaking both wire formats."""

from agents.testing.scripted_server import ScriptedLLMServer

__all__ = ["ScriptedLLMServer"]
