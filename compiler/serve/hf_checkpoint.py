"""An HF checkpoint directory from a model ``tkcc serve`` loads (a GGUF file: ``smollm2-135m``), so that
other engines (vLLM, transformers) serve the very weights and tokenizer tkcc serves.

    write_hf_checkpoint(load_served_model("smollm2-135m"), Path("build/SmolLM2-135M-Instruct"))

What it writes (a Llama checkpoint as transformers and vLLM read it):
  config.json              ``LlamaForCausalLM`` from the model spec, ``torch_dtype`` of the tensors written
  model.safetensors        tkcc's dequantized weights under HF names (``internal_to_hf``); the GGUF loader
                           has already undone llama.cpp's q/k row permutation, so q/k are in HF's layout
                           (the half-split rotary vLLM and transformers apply); tied embeddings: no lm_head
  tokenizer.json           the ``tokenizers.Tokenizer`` tkcc built from the GGUF metadata (same ids)
  tokenizer_config.json    ``PreTrainedTokenizerFast``, the chat template, bos/eos/pad tokens
  generation_config.json   bos and every stop id tkcc stops at (``eos_token_id`` as a list)
Cost: SmolLM2-135M in fp32, 540 MB, ~5 s to write (after the GGUF's ~10 s dequantization).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from compiler.serve.model import BPETokenizer, ModelLoadError, ServedModel

_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def hf_config(spec, dtype: torch.dtype, bos: int | None, eos: int | None) -> dict:
    """config.json of a dense Llama-family spec (what ``ModelSpec.from_config`` reads back)."""
    if spec.family != "llama" or spec.num_experts or spec.qk_norm != "none":
        raise ModelLoadError(f"{spec.name}: only dense Llama models can be written as HF checkpoints, "
                             f"not family {spec.family!r}")
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": spec.hidden_size,
           "intermediate_size": spec.intermediate_size, "num_hidden_layers": spec.num_layers,
           "num_attention_heads": spec.num_heads, "num_key_value_heads": spec.num_kv_heads,
           "head_dim": spec.head_dim, "vocab_size": spec.vocab_size, "rms_norm_eps": spec.rms_norm_eps,
           "rope_theta": spec.rope_theta, "max_position_embeddings": spec.max_position_embeddings,
           "tie_word_embeddings": spec.tie_word_embeddings, "attention_bias": spec.qkv_bias,
           "mlp_bias": False, "hidden_act": "silu", "initializer_range": 0.02, "use_cache": True,
           "torch_dtype": _DTYPES[dtype]}
    if spec.rope_scaling:
        cfg["rope_scaling"] = spec.rope_scaling
    if bos is not None:
        cfg["bos_token_id"] = bos
    if eos is not None:
        cfg["eos_token_id"] = eos
    return cfg


def _special(tok, i: int | None) -> str | None:
    return None if i is None else tok.id_to_token(i)


def write_hf_checkpoint(served: ServedModel, out: Path, dtype: torch.dtype = torch.float32,
                        bos: int | None = None, eos: int | None = None) -> Path:
    """Writes ``served`` (real weights and a BPE tokenizer) as an HF checkpoint directory ``out``; the
    safetensors file last and atomically, so a directory with ``model.safetensors`` is complete.
    ``eos``: the tokenizer's EOS (default: its first stop id); ``bos``: its BOS (default none)."""
    from safetensors.torch import save_file

    from persistent_engine import internal_to_hf

    if served.params is None or not isinstance(served.tokenizer, BPETokenizer):
        raise ModelLoadError(f"{served.name}: a checkpoint needs real weights and a BPE tokenizer "
                             f"(this model has {served.source} weights)")
    spec, tok = served.spec, served.tokenizer
    stops = list(tok.stop_ids)
    eos = eos if eos is not None else (stops[0] if stops else None)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.to(dtype).contiguous()
               for k, v in internal_to_hf(spec, list(range(spec.num_layers)), served.params).items()}
    (out / "config.json").write_text(json.dumps(hf_config(spec, dtype, bos, eos), indent=2) + "\n")
    tok.tok.save(str(out / "tokenizer.json"))
    eos_s, bos_s = _special(tok.tok, eos), _special(tok.tok, bos)
    tcfg = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": spec.max_position_embeddings,
            "chat_template": tok.chat_template, "eos_token": eos_s, "pad_token": eos_s, "bos_token": bos_s,
            "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False}
    (out / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2) + "\n")
    gen = {"bos_token_id": bos, "eos_token_id": stops or eos, "_from_model_config": False}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    tmp = out / "model.safetensors.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt", "tkcc_source": os.path.basename(served.source)})
    os.replace(tmp, out / "model.safetensors")
    return out


def gguf_special_ids(path: str | Path) -> tuple[int | None, int | None]:
    """(bos, eos) token ids of a GGUF file's tokenizer metadata."""
    import gguf

    from compiler.serve.model import _field

    reader = gguf.GGUFReader(str(path))
    ids = [_field(reader, f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos")]
    return tuple(None if i is None else int(i) for i in ids)


def export_model(model: str, out: Path, weights: str | None = None, dtype: torch.dtype = torch.float32) -> Path:
    """``model`` (an alias with a GGUF, e.g. ``smollm2-135m``, or ``--weights x.gguf``) as a checkpoint in
    ``out``, the GGUF's bos/eos kept; an existing complete checkpoint there is reused."""
    from compiler.serve.model import load_served_model

    if (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file():
        return out
    served = load_served_model(model, weights, dtype=torch.float32)
    bos, eos = gguf_special_ids(served.source) if served.source.endswith(".gguf") else (None, None)
    return write_hf_checkpoint(served, out, dtype, bos, eos)
