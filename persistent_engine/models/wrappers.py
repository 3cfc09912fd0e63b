"""Multimodal wrappers: a ``*ForConditionalGeneration`` config.json whose ``text_config`` is a text decoder tkcc
implements runs that decoder, text decode only. Pure data (no torch).

``unwrap(cfg, name)`` returns the text decoder's config (with the text architecture in ``architectures``) and
one line naming what is not compiled (the vision tower and projector), or ``cfg`` itself and ``""`` for a
config that is not a wrapper. Every key of the wrapper is either listed here as not changing text decoding
(with the reason) or the config is refused by name (``SpecError``); keys it shares with its text_config
(``tie_word_embeddings``, ``quantization_config``) must agree with them. HF ``PretrainedConfig``'s serialised
defaults (transformers 4.x writes them into every nested config, and some configs carry ``_name_or_path`` and
the like at the top) are dropped, wrapper or not, after the ones that would change the model are checked off.

  wrapper (architectures)               text decoder                  source
  Llama4ForConditionalGeneration        Llama4ForCausalLM             HF transformers modeling_llama4.py
  KimiK25ForConditionalGeneration       DeepseekV3ForCausalLM         moonshotai/Kimi-K2.5 modeling_kimi_k25.py
  KimiK3ForConditionalGeneration        KimiLinearForCausalLM         moonshotai/Kimi-K3
  Qwen3_5(Moe)ForConditionalGeneration  Qwen3_5(Moe)ForCausalLM       HF transformers modeling_qwen3_5(_moe).py
  Gemma4ForConditionalGeneration        Gemma4ForCausalLM             HF transformers modeling_gemma4.py
"""

from __future__ import annotations

from dataclasses import dataclass

from persistent_engine.models.config_keys import SpecError

__all__ = ["WRAPPERS", "HF_DEFAULTS", "unwrap"]

_VISION = "the vision tower and projector: they run only on image/video inputs, not compiled (text decode only)"
# keys any wrapper may carry without changing text decoding
_COMMON = {
    "architectures": "selects the wrapper", "model_type": "selects the wrapper",
    "auto_map": "names the HF remote-code classes", "transformers_version": "provenance",
    "dtype": "the checkpoint's storage dtype", "torch_dtype": "the checkpoint's storage dtype",
    "bos_token_id": "tokenizer ids", "eos_token_id": "tokenizer ids", "pad_token_id": "tokenizer ids",
    "initializer_range": "training-time initialisation", "ignore_index": "training loss",
    "text_config": "the text decoder tkcc runs", "vision_config": _VISION,
    "tie_word_embeddings": "checked equal to text_config's", "quantization_config": "checked equal to text_config's",
}


@dataclass(frozen=True)
class Wrapper:
    text_architecture: str              # the HF text decoder class tkcc runs
    outer: tuple[str, ...]              # wrapper keys beyond _COMMON that concern only image/video inputs (their
                                        # placeholder token ids and strings, how video frames are chunked)
    tower: str                          # what is not compiled, for the one-line note


WRAPPERS: dict[str, Wrapper] = {
    "Llama4ForConditionalGeneration": Wrapper(
        "Llama4ForCausalLM", ("boi_token_index", "eoi_token_index", "image_token_index"),
        "vision_config (the Llama-4 vision encoder and multi_modal_projector)"),
    "KimiK25ForConditionalGeneration": Wrapper(
        "DeepseekV3ForCausalLM", ("media_placeholder_token_id", "use_unified_vision_chunk", "video_placeholder"),
        "vision_config (MoonViT vision_tower and mm_projector)"),
    "KimiK3ForConditionalGeneration": Wrapper(
        "KimiLinearForCausalLM", ("media_placeholder_token_id", "image_placeholder"),
        "vision_config (MoonViT vision_tower and mm_projector)"),
    "Qwen3_5ForConditionalGeneration": Wrapper(
        "Qwen3_5ForCausalLM", ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"),
        "vision_config (the Qwen3.5 vision encoder and merger)"),
    "Qwen3_5MoeForConditionalGeneration": Wrapper(
        "Qwen3_5MoeForCausalLM", ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"),
        "vision_config (the Qwen3.5 vision encoder and merger)"),
    "Gemma4ForConditionalGeneration": Wrapper(
        "Gemma4ForCausalLM", ("audio_config", "audio_token_id", "boa_token_id", "boi_token_id", "eoa_token_id",
                              "eoa_token_index", "eoi_token_id", "image_token_id", "video_token_id",
                              "vision_soft_tokens_per_image"),
        "vision_config and audio_config (the Gemma-4 vision and audio towers and their embedders)"),
}

# HF PretrainedConfig's serialised defaults: generation / training / bookkeeping, read by no forward pass
HF_DEFAULTS = (
    "_name_or_path", "_attn_implementation_autoset", "add_cross_attention", "bad_words_ids", "begin_suppress_tokens",
    "chunk_size_feed_forward", "cross_attention_hidden_size", "decoder_start_token_id", "diversity_penalty",
    "do_sample", "early_stopping", "encoder_no_repeat_ngram_size", "exponential_decay_length_penalty",
    "finetuning_task", "forced_bos_token_id", "forced_eos_token_id", "id2label", "is_decoder", "is_encoder_decoder",
    "label2id", "length_penalty", "max_length", "min_length", "no_repeat_ngram_size", "num_beam_groups", "num_beams",
    "num_return_sequences", "output_attentions", "output_hidden_states", "output_scores", "prefix", "problem_type",
    "pruned_heads", "remove_invalid_values", "repetition_penalty", "return_dict", "return_dict_in_generate",
    "sep_token_id", "suppress_tokens", "task_specific_params", "temperature", "tf_legacy_loss", "tie_encoder_decoder",
    "tokenizer_class", "top_k", "top_p", "torchscript", "typical_p", "use_bfloat16")
# of those, the ones whose non-default value would change the model
HF_MUST_BE_OFF = ("add_cross_attention", "is_encoder_decoder", "pruned_heads", "cross_attention_hidden_size")


def _wrapper_of(cfg: dict) -> str | None:
    archs = cfg.get("architectures") or []
    return next((a for a in archs if a in WRAPPERS), None)


def _without_hf_defaults(c: dict, name: str) -> dict:
    """``c`` less HF PretrainedConfig's serialised defaults, once those that would change the model are off."""
    for key in HF_MUST_BE_OFF:
        if c.get(key):
            raise SpecError(f"{name}: config key {key!r} = {c[key]!r} is not implemented (tkcc implements its "
                            "default)")
    return {k: v for k, v in c.items() if k not in HF_DEFAULTS}


def unwrap(cfg: dict, name: str) -> tuple[dict, str]:
    """(the text decoder's config, the one-line note of what is not compiled); a non-wrapper: (cfg, "") (both
    without HF's serialised defaults)."""
    arch = _wrapper_of(cfg)
    if arch is None:
        return _without_hf_defaults(cfg, name), ""
    if not isinstance(cfg.get("text_config"), dict):
        raise SpecError(f"{name}: {arch} without a text_config object")
    text = _without_hf_defaults(cfg["text_config"], name)
    w = WRAPPERS[arch]
    for key in cfg:
        if key not in _COMMON and key not in w.outer:
            raise SpecError(f"{name}: config key {key!r} is not implemented for the {arch} wrapper and not known "
                            "to leave text decoding unchanged; refusing the config rather than ignoring it")
    if "tie_word_embeddings" in cfg and "tie_word_embeddings" in text \
            and bool(cfg["tie_word_embeddings"]) != bool(text["tie_word_embeddings"]):
        raise SpecError(f"{name}: tie_word_embeddings differs between the {arch} wrapper and its text_config")
    if "quantization_config" in cfg and cfg["quantization_config"] != text.get("quantization_config"):
        raise SpecError(f"{name}: quantization_config differs between the {arch} wrapper and its text_config")
    out = {**text, "architectures": [w.text_architecture]}
    if "tie_word_embeddings" in cfg:
        out["tie_word_embeddings"] = cfg["tie_word_embeddings"]
    return out, f"{arch}: {w.tower} not compiled; text decode only"
