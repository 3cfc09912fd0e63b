"""DeepSeek-V4 over the paged cache: prefill chunks and decode steps with the generic decoder's interface
(``build_model`` returns a ``V4Decoder`` for the ``deepseek_v4`` family), every op through the registry.

The math per layer is ``models/deepseek_v4.py``'s (Hugging Face transformers' ``modeling_deepseek_v4.py``:
hyper-connections, window / CSA / HCA attention with sinks, grouped o-projection, hash or sqrtsoftplus
routing, clamped SwiGLU experts); this module only carries its state across steps. The residual is
``hc_mult`` streams per token and needs no state; the cache of layer i holds (``alloc_v4_cache``):

    k[i]             [NB, BS, D]      each token's normed, rotated K = V row (the window attends the last W)
    v[i]             [NB, BS, 2C]     compressed layers: each token's compressor source rows [kv | gate]
                                      (C = 2D on CSA layers, whose windows overlap, D on HCA layers)
    entries[i]       [B, NE, D]       compressed layers: the closed windows' entries (kv_compress, rotated at
                                      w * r), NE = capacity // r per sequence
    index_k[i]       [NB, BS, 4Di]    CSA layers: the indexer compressor's source rows
    index_entries[i] [B, NE, Di]      CSA layers: the indexer's compressed keys

A step writes its tokens' rows, then closes every window one of its tokens completes (token at position p
closes window w = (p + 1) // r - 1 when (p + 1) % r == 0: its entry pools source rows (w - 1) r .. (w + 1) r - 1
on CSA layers, w r .. (w + 1) r - 1 on HCA layers), then attends. So a prefill of n tokens followed by decode
steps gives the logits of one longer prefill (tests/persistent_engine/test_deepseek_v4_decoder.py). A decode
step closes its windows without a host sync (every token's candidate entry computed, written where it
closes); a prefill chunk pools only the closing tokens (one host read of their count).

Bytes per token and layer: ``ModelSpec.kv_bytes_per_token_layer`` (this layout keeps every source row; an
engine that keeps only the open windows' rows stores D + D / r (+ Di / r) per token instead).
"""

from __future__ import annotations

import torch

from persistent_engine.models import deepseek_v4 as v4
from persistent_engine.models.kv_cache import KVCache
from persistent_engine.models.spec import ModelSpec, SpecError
from persistent_engine.ops.dsa import _rows, token_seq_pos
from persistent_engine.ops.opdef import DEFAULT_BLOCK_SIZE
from persistent_engine.ops.registry import call

__all__ = ["V4Decoder", "alloc_v4_cache", "hf_config", "v4_config"]


def hf_config(spec: ModelSpec) -> dict:
    """The HF ``config.json`` fields ``deepseek_v4.V4Config.from_hf`` / ``param_shapes`` read, from the spec."""
    return {"hidden_size": spec.hidden_size, "num_attention_heads": spec.num_heads, "head_dim": spec.head_dim,
            "qk_rope_head_dim": spec.qk_rope_head_dim, "num_hidden_layers": spec.num_layers,
            "compress_ratios": list(spec.compress_ratios),
            "compress_rates": {"compressed_sparse_attention": spec.csa_ratio, "heavily_compressed_attention": 128},
            "num_hash_layers": spec.num_hash_layers, "hc_mult": spec.hc_mult, "hc_sinkhorn_iters": spec.hc_sinkhorn_iters,
            "hc_eps": spec.hc_eps, "rms_norm_eps": spec.rms_norm_eps, "sliding_window": spec.sliding_window,
            "o_groups": spec.o_groups, "o_lora_rank": spec.o_lora_rank, "q_lora_rank": spec.q_lora_rank,
            "index_n_heads": spec.index_n_heads, "index_head_dim": spec.index_head_dim, "index_topk": spec.index_topk,
            "num_experts_per_tok": spec.num_experts_per_tok, "n_routed_experts": spec.num_experts,
            "moe_intermediate_size": spec.moe_intermediate_size, "scoring_func": spec.scoring,
            "routed_scaling_factor": spec.routed_scaling_factor, "swiglu_limit": spec.swiglu_limit,
            "rope_theta": spec.rope_theta, "compress_rope_theta": spec.compress_rope_theta,
            "rope_scaling": spec.rope_scaling, "vocab_size": spec.vocab_size}


def v4_config(spec: ModelSpec) -> v4.V4Config:
    return v4.V4Config.from_hf(hf_config(spec))


def alloc_v4_cache(spec: ModelSpec, layers: list[int], batch: int, tokens_per_seq: int, *, device="cpu",
                   dtype=torch.bfloat16, block_size: int = DEFAULT_BLOCK_SIZE, seed: int = 0,
                   fill: str = "random") -> KVCache:
    """The layout of the module doc for ``batch`` sequences of up to ``tokens_per_seq`` tokens; blocks in a
    seeded random order; ``fill`` "random" (N(0, 1): a synthetic context) or "zeros"."""
    mb = max(1, -(-tokens_per_seq // block_size))
    nb = batch * mb
    perm = torch.randperm(nb, generator=torch.Generator().manual_seed(seed))
    cache = KVCache(block_size=block_size, block_tables=perm.view(batch, mb).to(torch.int32).to(device))
    g = torch.Generator(device=torch.device(device))
    g.manual_seed(seed)

    def pool(*shape):
        if fill == "zeros":
            return torch.zeros(shape, device=device, dtype=dtype)
        return torch.randn(shape, device=device, dtype=dtype, generator=g)
    d, di, cap = spec.head_dim, spec.index_head_dim, mb * block_size
    for i in layers:
        r = spec.compress_ratios[i]
        cache.k[i] = pool(nb, block_size, d)
        if r:
            csa = r == spec.csa_ratio
            cache.v[i] = pool(nb, block_size, 2 * (2 if csa else 1) * d)
            cache.entries[i] = pool(batch, max(1, cap // r), d)
            if csa:
                cache.index_k[i] = pool(nb, block_size, 4 * di)
                cache.index_entries[i] = pool(batch, max(1, cap // r), di)
    return cache


class _Step:
    """What every layer of one step shares: each token's sequence and position, the windows it closes."""

    def __init__(self, wl, inv_freq: dict[bool, torch.Tensor]):
        t = wl.token_ids.shape[0]
        self.wl, self.t, self.inv_freq = wl, t, inv_freq
        self.seq, self.pos = token_seq_pos(wl.cu_seqlens_q, wl.context_lens, t)
        self.decode = wl.phase == "decode"

    def angles(self, positions: torch.Tensor, compressed: bool) -> torch.Tensor:
        """[P, R/2] fp64 rotary angles (``deepseek_v4.rope_angles``) from the decoder's on-device frequencies."""
        return positions.double()[:, None] * self.inv_freq[compressed][None, :]

    def closing(self, r: int) -> torch.Tensor:
        """Rows of the tokens whose window of r closes at them (decode: every row, masked when written)."""
        if self.decode:
            return torch.arange(self.t, device=self.pos.device)
        return torch.nonzero((self.pos + 1) % r == 0).flatten()


def _close_windows(cfg: v4.V4Config, st: _Step, pool: torch.Tensor, entries: torch.Tensor, w: dict, p: str,
                   r: int, overlap: bool) -> None:
    """Pool the windows the step's tokens close from the source rows in ``pool`` [NB, BS, 2C] into
    ``entries`` [B, NE, Dc] (rotated at w r), as ``kv_compress`` over the whole sequence would."""
    rows = st.closing(r)
    if rows.numel() == 0:
        return
    seq, pos = st.seq[rows], st.pos[rows]
    win = (pos + 1) // r - 1                                                    # [n] window index (-1: none yet)
    slots = 2 * r if overlap else r
    start = (win - (1 if overlap else 0)) * r
    src_pos = start[:, None] + torch.arange(slots, device=pos.device)[None, :]  # [n, slots]
    src = _rows(pool, st.wl.block_tables, seq, src_pos)                         # [n, slots, 2C]
    c = src.shape[-1] // 2
    kv, gate = src[..., :c], src[..., c:]
    before = (src_pos < 0)[..., None]                                           # window 0's empty Ca slots
    kv = kv.masked_fill(before, 0.0)
    gate = gate.masked_fill(before, float("-inf"))
    n = rows.numel()
    ent = call("kv_compress", kv.reshape(n * slots, c), gate.reshape(n * slots, c), w[p + "position_bias"],
               w[p + "kv_norm.weight"], r, overlap, cfg.eps)                    # [n * slots / r, Dc]
    ent = ent.view(n, slots // r, -1)[:, -1]                                    # the window each token closes
    ent = v4.rope(ent, st.angles(win.clamp(min=0) * r, True))
    ok = win >= 0
    if st.decode:                                                               # no host sync: keep the old entry
        ok = ok & ((pos + 1) % r == 0)
    w_idx = win.clamp(min=0)
    entries[seq, w_idx] = torch.where(ok[:, None], ent.to(entries.dtype), entries[seq, w_idx])


def _write_rows(pool: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor) -> None:
    pool.view(-1, pool.shape[-1])[slots] = rows.to(pool.dtype)


def _src_rows(w: dict, p: str, a: torch.Tensor) -> torch.Tensor:
    """[T, 2C]: a compressor's kv and gate projections of the step's tokens."""
    return torch.cat([call("linear", a, w[p + "kv_proj.weight"], None), call("linear", a, w[p + "gate_proj.weight"], None)],
                     dim=-1)


def attention(cfg: v4.V4Config, w: dict, p: str, a: torch.Tensor, st: _Step, cache: KVCache, i: int) -> torch.Tensor:
    """Layer i's attention block on the step's tokens a[T, H] (``deepseek_v4.attention`` over the cache)."""
    wl, ratio = st.wl, cfg.layer_ratios[i]
    t, hq, d = a.shape[0], cfg.heads, cfg.head_dim
    ang = st.angles(st.pos, ratio > 0)
    q_res = call("rms_norm", call("linear", a, w[p + "q_a_proj.weight"], None), w[p + "q_a_norm.weight"], cfg.eps)
    q = v4.rope(v4._unit_rms(call("linear", q_res, w[p + "q_b_proj.weight"], None).view(t, hq, d), cfg.eps), ang)
    kv = v4.rope(call("rms_norm", call("linear", a, w[p + "kv_proj.weight"], None), w[p + "kv_norm.weight"], cfg.eps), ang)
    _write_rows(cache.k[i], wl.slot_mapping, kv)
    b = wl.context_lens.shape[0]
    entries, n_entries, picks = a.new_zeros(b, 1, d), torch.zeros(b, dtype=torch.long, device=a.device), None
    if ratio:
        overlap = ratio == cfg.csa_ratio
        cp = p + "compressor."
        _write_rows(cache.v[i], wl.slot_mapping, _src_rows(w, cp, a))
        _close_windows(cfg, st, cache.v[i], cache.entries[i], w, cp, ratio, overlap)
        entries, n_entries = cache.entries[i], wl.context_lens.long() // ratio
        if overlap:
            ip = cp + "indexer."
            _write_rows(cache.index_k[i], wl.slot_mapping, _src_rows(w, ip, a))
            _close_windows(cfg, st, cache.index_k[i], cache.index_entries[i], w, ip, ratio, True)
            iq = v4.rope(call("linear", q_res, w[ip + "q_b_proj.weight"], None).view(t, cfg.index_heads, cfg.index_dim),
                         ang)
            iw = call("linear", a, w[ip + "scorer.weights_proj.weight"], None).float() * cfg.index_heads ** -0.5
            picks = call("csa_indexer", iq, iw, cache.index_entries[i], n_entries, wl.cu_seqlens_q, wl.context_lens,
                         ratio, cfg.index_topk)
    o = call("compressed_attention", q, cache.k[i], wl.block_tables, wl.cu_seqlens_q, wl.context_lens, entries,
             n_entries, picks, ratio, cfg.window, w[p + "sinks"], d ** -0.5)
    o = v4.rope(o, ang, inverse=True)
    grouped = call("grouped_linear", o.reshape(t, cfg.o_groups, -1), w[p + "o_a_proj.weight"])
    return call("linear", grouped.reshape(t, -1), w[p + "o_b_proj.weight"], None)


class V4Decoder:
    """The decoder interface (``step``, ``hidden``, ``alloc_cache``...) for DeepSeek-V4; ``params`` are the
    checkpoint's tensors by HF name (``deepseek_v4.param_shapes``)."""

    def __init__(self, spec: ModelSpec, layers: list[int], params: dict[str, torch.Tensor], device, dtype):
        self.spec, self.layers, self.params = spec, list(layers), params
        self.device, self.dtype = torch.device(device), dtype
        self.cfg = v4_config(spec)
        # rope_angles' inverse frequencies (window-only / compressed layers) on the device, so a decode step
        # copies nothing from the host (CUDA-graph capturable)
        self.inv_freq = {c: v4.rope_angles(self.cfg, torch.ones(1), c)[0].to(self.device) for c in (False, True)}
        self.blocks: list = []          # no generic blocks: routing plants nothing (uniform random routers)

    @property
    def max_positions(self) -> int:
        return self.spec.max_position_embeddings

    def alloc_cache(self, batch: int, tokens_per_seq: int, *, block_size: int = DEFAULT_BLOCK_SIZE, seed: int = 0,
                    fill: str = "random") -> KVCache:
        return alloc_v4_cache(self.spec, self.layers, batch, tokens_per_seq, device=self.device, dtype=self.dtype,
                              block_size=block_size, seed=seed, fill=fill)

    @torch.no_grad()
    def hidden(self, wl) -> torch.Tensor:
        """Final-normed hidden states of every token of the step: [T, H]. Writes the step's cache rows."""
        cfg, w, st = self.cfg, self.params, _Step(wl, self.inv_freq)
        x = call("embedding", wl.token_ids, w["model.embed_tokens.weight"])
        x = x[:, None, :].expand(-1, cfg.hc_mult, -1).contiguous()               # [T, N, H] the streams
        for i in self.layers:
            p = f"model.layers.{i}."
            a, post, comb = call("hc_pre", x, *v4._hc(w, p + "attn_hc."), cfg.hc_iters, cfg.hc_eps, cfg.eps)
            a = call("rms_norm", a, w[p + "input_layernorm.weight"], cfg.eps)
            x = call("hc_post", attention(cfg, w, p + "self_attn.", a, st, wl.cache, i), x, post, comb)
            a, post, comb = call("hc_pre", x, *v4._hc(w, p + "ffn_hc."), cfg.hc_iters, cfg.hc_eps, cfg.eps)
            a = call("rms_norm", a, w[p + "post_attention_layernorm.weight"], cfg.eps)
            x = call("hc_post", v4.moe(cfg, w, p + "mlp.", a, wl.token_ids, i), x, post, comb)
        hp = "model.hc_head."
        h = call("hc_head", x, w[hp + "hc_fn"], w[hp + "hc_scale"], w[hp + "hc_base"], cfg.hc_eps, cfg.eps)
        return call("rms_norm", h, w["model.norm.weight"], cfg.eps)

    @torch.no_grad()
    def step(self, wl) -> torch.Tensor:
        """Logits of each sequence's last token [B, V] fp32 (decode: of every token)."""
        h = self.hidden(wl)
        if wl.phase != "decode":
            h = h[wl.last_token_index]
        return call("lm_head", h, self.params["lm_head.weight"])

    @torch.no_grad()
    def greedy(self, logits: torch.Tensor) -> torch.Tensor:
        return call("sample", logits, 0.0, 0)

    def weight_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.params.values())


def build_v4(spec: ModelSpec, layers: list[int], device, dtype, seed: int, weights) -> V4Decoder:
    if weights is not None:
        raise SpecError(f"{spec.name}: loading DeepSeek-V4 checkpoints is not implemented yet (seeded random weights "
                        "only: leave out --weights)")
    return V4Decoder(spec, layers, v4.init_weights(hf_config(spec), layers, device=device, dtype=dtype, seed=seed),
                     device, dtype)
