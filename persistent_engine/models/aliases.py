"""The model aliases of DESIGN.md: each alias names a config.json under ``models/configs`` and the release it
is; ``NAME+tiny`` is NAME's architecture at toy size (``ModelSpec.scaled_down``). Pure data, no torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["ALIASES", "CONFIG_DIR", "RELEASES", "TINY_SUFFIX", "alias_help", "config_of_path", "known_models",
           "tiny_name"]

CONFIG_DIR = Path(__file__).with_name("configs")

# each family's alias names its newest release; older releases keep versioned aliases
ALIASES = {
    "llama-1b": "llama-1b.json",
    "llama-8b": "llama-8b.json",
    "qwen3-moe": "qwen3-moe.json",
    "qwen3-coder": "qwen3-coder-480b.json",
    "glm": "glm-5.2.json",
    "glm-5.2": "glm-5.2.json",
    "glm-5.1": "glm-5.1.json",
    "glm-4.6": "glm-4.6.json",
    "minimax": "minimax-m3.json",
    "minimax-m3": "minimax-m3.json",
    "minimax-m2.7": "minimax-m2.7.json",
    "minimax-m2.5": "minimax-m2.5.json",
    "deepseek": "deepseek-v4-flash.json",
    "deepseek-v4-flash": "deepseek-v4-flash.json",
    "deepseek-v3": "deepseek.json",
    "deepseek-v3.2": "deepseek-v3.2.json",
    "mixtral": "mixtral-8x7b.json",
    "mixtral-8x7b": "mixtral-8x7b.json",
    "gemma": "gemma-3-27b.json",
    "gemma-3-27b": "gemma-3-27b.json",
    "gemma-2-9b": "gemma-2-9b.json",
    "gemma4": "gemma-4-31b.json",
    "gemma-4-31b": "gemma-4-31b.json",
    "gemma-4-e2b": "gemma-4-e2b.json",
    "gemma-4-26b-a4b": "gemma-4-26b-a4b.json",
    "llama4": "llama-4-scout.json",
    "llama-4-scout": "llama-4-scout.json",
    "llama-4-maverick": "llama-4-maverick.json",
    "kimi": "kimi-k3.json",
    "kimi-k3": "kimi-k3.json",
    "kimi-k2.5": "kimi-k2.5.json",
    "kimi-k2": "kimi.json",
    "mimo": "mimo-v2-flash.json",
    "mimo-v2-flash": "mimo-v2-flash.json",
    "gpt-oss": "gpt-oss-120b.json",
    "gpt-oss-120b": "gpt-oss-120b.json",
    "gpt-oss-20b": "gpt-oss-20b.json",
    "qwen3.5": "qwen3.5-moe.json",
    "qwen3.5-moe": "qwen3.5-moe.json",
    "nemotron": "nemotron-3-super.json",
    "nemotron-3-super": "nemotron-3-super.json",
    "nemotron-3-nano": "nemotron-3-nano.json",
    "smollm2-135m": "smollm2-135m.json",
    "tiny-dense": "tiny-dense.json",
    "tiny-moe": "tiny-moe.json",
    "tiny-mla": "tiny-mla.json",
}
# the release each alias names (tkcc doctor and --help list them)
RELEASES = {
    "llama-1b": "Llama-3.2-1B", "llama-8b": "Llama-3.1-8B", "qwen3-moe": "Qwen3-30B-A3B",
    "glm": "GLM-5.2", "glm-5.2": "GLM-5.2", "glm-5.1": "GLM-5.1", "glm-4.6": "GLM-4.6",
    "minimax": "MiniMax-M3", "minimax-m3": "MiniMax-M3", "minimax-m2.7": "MiniMax-M2.7",
    "minimax-m2.5": "MiniMax-M2.5",
    "deepseek": "DeepSeek-V4-Flash", "deepseek-v4-flash": "DeepSeek-V4-Flash", "deepseek-v3": "DeepSeek-V3",
    "deepseek-v3.2": "DeepSeek-V3.2", "mixtral": "Mixtral-8x7B-v0.1", "mixtral-8x7b": "Mixtral-8x7B-v0.1",
    "gemma": "Gemma-3-27B (text)", "gemma-3-27b": "Gemma-3-27B (text)", "gemma-2-9b": "Gemma-2-9B",
    "gemma4": "Gemma-4-31B (text)", "gemma-4-31b": "Gemma-4-31B (text)",
    "gemma-4-e2b": "Gemma-4-E2B (text)", "gemma-4-26b-a4b": "Gemma-4-26B-A4B (text)",
    "llama4": "Llama-4-Scout-17B-16E-Instruct (text)", "llama-4-scout": "Llama-4-Scout-17B-16E-Instruct (text)",
    "llama-4-maverick": "Llama-4-Maverick-17B-128E-Instruct (text)",
    "kimi": "Kimi-K3", "kimi-k3": "Kimi-K3", "kimi-k2.5": "Kimi-K2.5 (text)", "kimi-k2": "Kimi-K2",
    "qwen3-coder": "Qwen3-Coder-480B-A35B-Instruct",
    "mimo": "MiMo-V2-Flash", "mimo-v2-flash": "MiMo-V2-Flash",
    "gpt-oss": "gpt-oss-120b", "gpt-oss-120b": "gpt-oss-120b", "gpt-oss-20b": "gpt-oss-20b",
    "qwen3.5": "Qwen3.5-35B-A3B", "qwen3.5-moe": "Qwen3.5-35B-A3B", "smollm2-135m": "SmolLM2-135M-Instruct",
    "nemotron": "Nemotron-3-Super-120B-A12B", "nemotron-3-super": "Nemotron-3-Super-120B-A12B",
    "nemotron-3-nano": "Nemotron-3-Nano-30B-A3B",
    "tiny-dense": "toy Llama", "tiny-moe": "toy GLM-4.x MoE", "tiny-mla": "toy DeepSeek-V3",
}
TINY_SUFFIX = "+tiny"       # "glm+tiny": GLM-5.2's architecture at toy size (what --tiny passes on)


def known_models() -> list[str]:
    return list(ALIASES)


def alias_help() -> str:
    """``glm (GLM-5.2), glm-5.1 (GLM-5.1), ...``: the aliases with the release each names."""
    return ", ".join(f"{a} ({RELEASES[a]})" if a in RELEASES else a for a in ALIASES)


def tiny_name(name: str, tiny: bool) -> str:
    """What ``--tiny`` passes on: NAME+tiny (NAME's architecture at toy size), or NAME unchanged."""
    return name if not tiny or name.endswith(TINY_SUFFIX) else name + TINY_SUFFIX


def config_of_path(name: str) -> dict[str, Any] | None:
    """The parsed config.json behind a model name that is a path (``None`` for an alias): what the judge
    hands its executors, which run in another working directory and may not read the user's files."""
    base = name[: -len(TINY_SUFFIX)] if name.endswith(TINY_SUFFIX) and len(name) > len(TINY_SUFFIX) else name
    if base in ALIASES:
        return None
    path = Path(base)
    path = path / "config.json" if path.is_dir() else path
    cfg = json.loads(path.read_text())       # ModelSpec.from_name has already parsed it with clear errors
    return cfg if isinstance(cfg, dict) else None
