"""The generic decoder: embeddings, N layers (GQA or MLA attention; dense or MoE MLP), final norm and
lm_head. Every op goes through the registry (``persistent_engine.ops.registry.call``), so an override
reaches every call site.

    model = build_model(ModelSpec.from_name("tiny-moe"), layers=spec.covering_layers())
    wl = make_workload(model, WorkloadPoint("decode", batch=4, context=100))
    logits = model.step(wl)                       # [B, V] fp32

Each block's input norm is fused with the block's first projection where that projection is the only
consumer (``fused_input`` of GQA attention: qkv; of a dense MLP: gate_up): the layer calls the composite
``add_rms_norm_linear``; GQA attention without QK-norm also fuses the rotary (``fused_rotary``: the layer
calls ``add_rms_norm_qkv_rotary``, whose default is add_rms_norm_linear then rotary_embedding, so the
numbers are the same); MLA and MoE blocks, whose normed input feeds several projections, keep
``fused_add_rms_norm``. The residual stream starts as zeros (x + 0 is exact), so layer 0 fuses the same way.

Regions (``ops/layers.py``): a decode step of a model whose every layer is dense GQA without QK-norm
(Llama-style, ``dense_gqa``) is one ``dense_gqa_decode_step`` call, each layer one ``dense_gqa_decode_layer``
(their defaults run the same ops in the same order, so the numbers are the same; ``hidden`` calls the
layer op too); prefill, other families and blocks wrapped by tensor parallelism keep the fine path.

A slice keeps each layer's original index (its weights equal the full model's layer i for the same
seed); embeddings, final norm and lm_head are always included. ``step`` does no host sync on the
decode path (prefill attention and large-batch MoE read lengths on the host), so a decode step can
be captured in a CUDA graph.
"""

from __future__ import annotations

import torch

from persistent_engine.models.attention import GQAAttention
from persistent_engine.models.dsa import DSAAttention
from persistent_engine.models.gemma4 import Gemma4Attention, Gemma4MoE, add_per_layer_input, per_layer_inputs
from persistent_engine.models.kv_cache import KVCache, alloc_kv_cache
from persistent_engine.models.mla import MLAAttention
from persistent_engine.models.moe import DenseMLP, MoEMLP
from persistent_engine.models.msa import BlockSparseAttention
from persistent_engine.models import llama4, qwen3_5
from persistent_engine.models.rope import attention_scale, cos_sin_cache, local_cos_sin_cache
from persistent_engine.models.spec import ModelSpec, SpecError
from persistent_engine.models.weights import init_params, load_weights
from persistent_engine.ops.layers import dense_gqa
from persistent_engine.ops.opdef import DEFAULT_BLOCK_SIZE
from persistent_engine.ops.registry import call


class Layer:
    def __init__(self, spec: ModelSpec, index: int, params: dict, cos_sin: torch.Tensor, scale: float,
                 selections: dict | None = None):
        p = f"layers.{index}."
        self.index, self.kind = index, spec.layer_kind(index)
        self.input_norm, self.post_norm = params[p + "input_norm"], params[p + "post_norm"]
        # Gemma: norms on the attention and MLP outputs before they join the residual (None elsewhere)
        self.attn_out_norm, self.mlp_out_norm = params.get(p + "attn_out_norm"), params.get(p + "mlp_out_norm")
        self.scalar = params.get(p + "layer_scalar")        # Gemma-4: the layer's output (residual too) times it
        self.kv_index = spec.kv_source(index)               # Gemma-4: K/V-sharing layers attend an earlier cache
        self.per_layer_input = spec.per_layer_input > 0     # Gemma-4: a per-layer input after the MLP
        if spec.linear_layers:           # Qwen3.5: Gated DeltaNet / gated attention, gated shared expert
            self.attn, self.mlp = qwen3_5.blocks(spec, params, p, cos_sin, scale, index)
        elif spec.family == "llama4":    # NoPE / chunked rope layers, input-scaled experts + shared expert
            self.attn, self.mlp = llama4.blocks(spec, params, p, cos_sin, scale, index)
        elif spec.sparse_attention:      # MLA + DSA; ``selections``: the decoder's top-k of this step by layer
            self.attn = DSAAttention(spec, params, p, cos_sin, scale, index, selections)
        elif spec.block_sparse(index):   # MiniMax-M3
            self.attn = BlockSparseAttention(spec, params, p, cos_sin, scale, index)
        elif spec.family == "gemma4":    # per-kind head dims, K = V, V norm
            self.attn = Gemma4Attention(spec, params, p, cos_sin, scale)
        else:
            attn = MLAAttention if spec.attention == "mla" else GQAAttention
            self.attn = attn(spec, params, p, cos_sin, scale)
        if not spec.linear_layers and spec.family != "llama4":
            moe = Gemma4MoE if spec.family == "gemma4" else MoEMLP     # Gemma-4: the MLP beside the experts
            self.mlp = DenseMLP(spec, params, p) if self.kind == "dense" else moe(spec, params, p)
        self.mlp_residual = isinstance(self.mlp, Gemma4MoE)     # the block also takes the residual (router input)
        # (weight, bias) each block's input projection fused with its norm, or None (read now: tensor
        # parallelism may wrap the blocks later)
        self.attn_in = getattr(self.attn, "fused_input", None)
        self.mlp_in = getattr(self.mlp, "fused_input", None)
        self.attn_rope = getattr(self.attn, "fused_rotary", None)      # (cos_sin, rotary_dim, Hq, Hk) or None

    def region_weights(self) -> tuple | None:
        """The 7 weights ``dense_gqa_decode_layer`` takes (input_norm .. down_weight), or None when this
        layer's blocks are not the plain dense GQA ones (another family, or wrapped by tensor parallelism)."""
        a, m = self.attn, self.mlp
        if type(a) is not GQAAttention or type(m) is not DenseMLP or a.fused_rotary is None or a.window \
                or a.sinks is not None or m.oai is not None or self.attn_out_norm is not None \
                or self.mlp_out_norm is not None:
            return None
        return (self.input_norm, a.qkv_w, a.qkv_b, a.o_w, self.post_norm, m.gate_up_w, m.down_w)


def _norm_into(x: torch.Tensor, residual: torch.Tensor, norm_w: torch.Tensor, eps: float, proj):
    """(block input, new residual): the normed x + residual, projected by ``proj`` when it is set."""
    if proj is None:
        return call("fused_add_rms_norm", x, residual, norm_w, eps)
    return call("add_rms_norm_linear", x, residual, norm_w, eps, *proj)


def _attn_input(layer: Layer, x: torch.Tensor, residual: torch.Tensor, eps: float, wl):
    """(attention input, new residual): rotated (q, k, v) when the layer fuses the rotary, else as
    ``_norm_into``."""
    if layer.attn_rope is None:
        return _norm_into(x, residual, layer.input_norm, eps, layer.attn_in)
    q, k, v, residual = call("add_rms_norm_qkv_rotary", x, residual, layer.input_norm, eps, *layer.attn_in,
                             wl.positions, *layer.attn_rope)
    return (q, k, v), residual


class Decoder:
    def __init__(self, spec: ModelSpec, layers: list[int], params: dict[str, torch.Tensor], device, dtype):
        self.spec, self.layers, self.params = spec, list(layers), params
        self.device, self.dtype = torch.device(device), dtype
        self.cos_sin = cos_sin_cache(spec, device=device)
        local = local_cos_sin_cache(spec, device=device)           # Gemma-3's sliding layers (None: one table)
        self.scale = attention_scale(spec)
        self.eps = spec.rms_norm_eps
        self.embed, self.final_norm = params["embed"], params["final_norm"]
        self.lm_head_w = params.get("lm_head", self.embed)
        # Gemma: embeddings times sqrt(hidden) rounded to the model dtype (HF Gemma*ScaledWordEmbedding)
        # (on the device: a host copy inside the step cannot be captured in a CUDA graph)
        self.embed_scale = torch.tensor(spec.hidden_size ** 0.5, dtype=dtype, device=self.device) \
            if spec.embed_scale else None
        self.selections: dict[int, torch.Tensor] = {}     # DSA: each full layer's top-k of the current step
        self.blocks = [Layer(spec, i, params, local if local is not None and spec.layer_window(i) else self.cos_sin,
                             self.scale, self.selections) for i in self.layers]
        self.dense_gqa = dense_gqa(spec)        # decode steps may run as regions (``_region_weights``)

    @property
    def max_positions(self) -> int:
        return self.cos_sin.shape[0]

    def alloc_cache(self, batch: int, tokens_per_seq: int, *, block_size: int = DEFAULT_BLOCK_SIZE, seed: int = 0,
                    fill: str = "random") -> KVCache:
        return alloc_kv_cache(self.spec, self.layers, batch, tokens_per_seq, device=self.device, dtype=self.dtype,
                              block_size=block_size, seed=seed, fill=fill)

    @torch.no_grad()
    def hidden(self, wl) -> torch.Tensor:
        """Final-normed hidden states of every token of the step: [T, H]."""
        x = call("embedding", wl.token_ids, self.embed)                           # [T, H]
        if self.embed_scale is not None:
            x = x * self.embed_scale
        residual = torch.zeros_like(x)             # x + 0 == x exactly: layer 0 is normed like the rest
        pli = per_layer_inputs(self.params, self.spec, wl.token_ids, x) if self.spec.per_layer_input else None
        regions = self._region_weights(wl)
        for j, layer in enumerate(self.blocks):
            if regions is not None:
                x, residual = call("dense_gqa_decode_layer", x, residual, *self._region_batch(wl, layer),
                                   *regions[j], *self._region_tail())
                continue
            a, residual = _attn_input(layer, x, residual, self.eps, wl)
            x = layer.attn(a, wl, wl.cache.k.get(layer.kv_index), wl.cache.v.get(layer.kv_index))
            if layer.attn_out_norm is not None:
                x = call("rms_norm", x, layer.attn_out_norm, self.eps)
            a, residual = _norm_into(x, residual, layer.post_norm, self.eps, layer.mlp_in)
            x = layer.mlp(a, residual) if layer.mlp_residual else layer.mlp(a)
            if layer.mlp_out_norm is not None:
                x = call("rms_norm", x, layer.mlp_out_norm, self.eps)
            if layer.per_layer_input:                     # the per-layer input on the whole hidden state
                x, residual = torch.zeros_like(x), add_per_layer_input(self.params, f"layers.{layer.index}.",
                                                                       x + residual, pli[:, layer.index], self.eps)
            if layer.scalar is not None:                  # (x + residual) * s, the sum left to the next norm
                x, residual = x * layer.scalar, residual * layer.scalar
        return call("fused_add_rms_norm", x, residual, self.final_norm, self.eps)[0]

    @torch.no_grad()
    def step(self, wl) -> torch.Tensor:
        """One forward step (decode, or a prefill chunk): logits of each sequence's last token [B, V] fp32.
        Writes the step's K/V into the workload's cache at its fixed slots, so it can run again."""
        regions = self._region_weights(wl)
        if regions is not None:
            c = wl.cache
            return call("dense_gqa_decode_step", wl.token_ids, wl.positions, wl.slot_mapping, wl.block_tables,
                        wl.context_lens, self.embed, self.final_norm, self.lm_head_w, regions,
                        tuple(c.k[i] for i in self.layers), tuple(c.v[i] for i in self.layers), *self._region_tail())
        h = self.hidden(wl)
        if wl.phase != "decode":
            h = h[wl.last_token_index]                                          # [B, H]
        logits = call("lm_head", h, self.lm_head_w)
        if self.spec.final_softcap:                                             # Gemma: tanh(z / c) * c
            logits = call("logit_softcap", logits, self.spec.final_softcap)
        return logits

    def _region_weights(self, wl) -> tuple | None:
        """Per layer the weights of ``dense_gqa_decode_layer`` when this step runs as regions (a decode step,
        every layer plain dense GQA), else None."""
        if wl.phase != "decode" or not getattr(self, "dense_gqa", False) or self.embed_scale is not None \
                or self.spec.final_softcap:
            return None
        weights = tuple(layer.region_weights() for layer in self.blocks)
        return None if any(w is None for w in weights) else weights

    def _region_batch(self, wl, layer: Layer) -> tuple:
        """positions, k_cache, v_cache, slot_mapping, block_tables, context_lens of ``layer``."""
        return (wl.positions, wl.cache.k[layer.index], wl.cache.v[layer.index], wl.slot_mapping, wl.block_tables,
                wl.context_lens)

    def _region_tail(self) -> tuple:
        """cos_sin_cache, eps, scale, rotary_dim, Hq, Hk (the regions' trailing arguments)."""
        cos_sin, rotary_dim, hq, hk = self.blocks[0].attn_rope
        return (cos_sin, self.eps, self.scale, rotary_dim, hq, hk)

    @torch.no_grad()
    def greedy(self, logits: torch.Tensor) -> torch.Tensor:
        return call("sample", logits, 0.0, 0)

    def weight_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.params.values())


def _resolve_layers(spec: ModelSpec, layers) -> list[int]:
    if layers is None:
        return list(range(spec.num_layers))
    if isinstance(layers, int):
        return list(range(layers))
    out = [int(i) for i in layers]
    bad = [i for i in out if not 0 <= i < spec.num_layers]
    if bad or len(set(out)) != len(out):
        raise SpecError(f"bad layer selection {out} for {spec.name} ({spec.num_layers} layers: 0..{spec.num_layers - 1},"
                        " each at most once)")
    spec.check_slice(out)
    return out


def build_model(spec: ModelSpec | str, layers=None, device="cpu", dtype=torch.bfloat16, seed: int = 0,
                weights=None) -> Decoder:
    """A decoder for ``spec`` (a ModelSpec, alias or config path) restricted to ``layers`` (None: all; an
    int n: the first n; a list: those indices). ``weights``: a safetensors file or directory with HF
    names, or None for seeded random weights."""
    if isinstance(spec, str):
        spec = ModelSpec.from_name(spec)
    idx = _resolve_layers(spec, layers)
    if spec.attention == "v4":                      # DeepSeek-V4: hyper-connection streams, compressed attention
        from persistent_engine.models.deepseek_v4_decoder import build_v4

        return build_v4(spec, idx, device, dtype, seed, weights)
    if weights is None:
        params = init_params(spec, idx, device=device, dtype=dtype, seed=seed)
    else:
        params = load_weights(spec, idx, weights, device=device, dtype=dtype)
    return make_decoder(spec, idx, params, device, dtype)


def make_decoder(spec: ModelSpec, layers: list[int], params: dict[str, torch.Tensor], device, dtype) -> Decoder:
    """The decoder of ``spec``'s family on ``params`` (the names ``build_model`` gives them): ``Decoder`` (Qwen3.5's
    Gated DeltaNet layers included), Kimi-Linear's (models/kimi.py: KDA + MLA, latent MoE, attention residuals)
    DeepSeek-V4's ``V4Decoder`` (models/deepseek_v4_decoder.py: hyper-connection streams, compressed attention) or
    Nemotron-H's (models/nemotron.py: Mamba-2 / NoPE attention / relu2 MLP / relu2 MoE blocks)."""
    if spec.attention == "v4":
        from persistent_engine.models.deepseek_v4_decoder import V4Decoder

        return V4Decoder(spec, layers, params, device, dtype)
    if spec.family == "kimi_linear":
        from persistent_engine.models.kimi import KimiDecoder

        return KimiDecoder(spec, layers, params, device, dtype)
    if spec.family == "nemotron_h":
        from persistent_engine.models.nemotron import NemotronDecoder

        return NemotronDecoder(spec, layers, params, device, dtype)
    return Decoder(spec, layers, params, device, dtype)
