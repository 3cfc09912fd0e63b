"""Parameter counts and memory accounting of a ``ModelSpec`` (models/spec.py mixes ``SpecSizes`` in): weight
bytes and KV or recurrent-state bytes per layer, how many layers fit a budget. Pure arithmetic on the
spec's fields; no torch (the cost model reads these on machines without it).
"""

from __future__ import annotations

from persistent_engine.models.gemma4_config import kv_shared, layer_intermediate

DTYPE_BYTES = {"bf16": 2.0, "bfloat16": 2.0, "fp16": 2.0, "float16": 2.0, "fp32": 4.0,
               "float32": 4.0, "fp8": 1.0, "fp4": 0.5}


class SpecSizes:
    """The size arithmetic of a ModelSpec; reads only its dataclass fields and structure methods
    (``attention``, ``layer_kind``, ``is_linear``...), so it holds no state of its own."""

    # ---------------------------------------------------------------- parameter counts
    def attention_params(self, i: int | None = None) -> int:
        """One attention block's parameters (layer i's; None: the mean layer's where layers differ)."""
        h = self.hidden_size
        if i is None and self.attention == "gqa" and self.window_kv_heads:     # MiMo: two layer kinds
            return round(sum(self.attention_params(j) for j in range(self.num_layers)) / self.num_layers)
        if self.attention == "v4":
            return _v4_attention_params(self, None)
        if self.attention == "mla":
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            q = (h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * self.num_heads * qk
                 if self.q_lora_rank else h * self.num_heads * qk)
            kv = (h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
                  + self.kv_lora_rank * self.num_heads * (self.qk_nope_head_dim + self.v_head_dim))
            return q + kv + self.num_heads * self.v_head_dim * h
        shared = i is not None and kv_shared(self, i)      # Gemma-4: no K/V projections, no k_norm
        hk = self.num_kv_heads if i is None else 0 if shared else self.layer_kv_heads(i)
        dh, dv = (self.head_dim, self.gqa_v_head_dim) if i is None else (self.layer_head_dim(i),
                                                                         self.layer_v_head_dim(i))
        v = 0 if i is not None and self.layer_k_eq_v(i) else hk * dv                     # Gemma-4 full layers: V = K
        q, k = self.num_heads * dh, hk * dh
        n = h * (q + k + v) + self.num_heads * dv * h
        if self.qkv_bias:
            n += q + k + v
        if self.o_bias:                                  # gpt-oss
            n += h
        if self.attention_sinks if i is None else self.layer_sinks(i):
            n += self.num_heads
        if self.qk_norm == "per_head":
            n += dh if shared else 2 * dh
        elif self.qk_norm == "per_layer":
            n += q + k
        return n

    def linear_attention_params(self) -> int:
        """A Gated DeltaNet layer: in_proj (qkv, z, b, a), conv [C, K], A_log, dt_bias, gated norm [Dv], out_proj."""
        h, hv, vd = self.hidden_size, self.linear_num_v_heads, self.linear_num_v_heads * self.linear_v_dim
        c = self.linear_conv_dim
        return h * (c + vd + 2 * hv) + c * self.linear_conv_kernel + 2 * hv + self.linear_v_dim + vd * h
    def kda_params(self) -> int:
        """One KDA layer: q, k, v [H Dk, hidden] each, their short convs [3 H Dk, W], f_a [Dk, hidden], f_b
        [H Dk, Dk], b [H, hidden], A_log [H], dt_bias [H Dk], output gate (full [H Dv, hidden] or g_a + g_b),
        o_norm [Dk], o [hidden, H Dk]."""
        h, n, d = self.hidden_size, self.kda_num_heads, self.kda_head_dim
        gate = h * n * d if self.kda_full_rank_gate else h * d + d * n * d
        return 3 * h * n * d + 3 * n * d * self.kda_conv_size + 2 * h * d + n * d * d + h * n + n + n * d + gate + d \
            + n * d * h

    def msa_params(self, i: int) -> int:
        """MiniMax-M3's block indexer of a sparse layer: index_q [Hk Di, H], index_k [Di, H], their norms."""
        if not self.block_sparse(i):
            return 0
        return self.hidden_size * (self.num_kv_heads + 1) * self.msa_index_dim + 2 * self.msa_index_dim

    def indexer_params(self, i: int) -> int:
        """The lightning indexer of a full DSA layer: wq_b [Hi Di, Lq], wk [Di, H], k_norm (LayerNorm
        weight + bias), weights_proj [Hi, H]."""
        if self.indexer_kind(i) != "full":
            return 0
        hi, di, h = self.index_n_heads, self.index_head_dim, self.hidden_size
        return self.q_lora_rank * hi * di + h * di + 2 * di + h * hi

    def dense_mlp_params(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size

    def moe_params(self) -> tuple[int, int]:
        """(total, active per token) parameters of one MoE block: router, experts, shared experts."""
        h = self.hidden_size
        lat = self.latent_moe_size or h
        expert = 3 * lat * self.moe_intermediate_size
        expert += (2 * self.moe_intermediate_size + lat) if self.moe_bias else 0       # gpt-oss: b13, b2
        shared = 3 * h * self.shared_intermediate_size * self.num_shared_experts
        router = h * self.num_experts + (self.num_experts if self.routing_bias or self.moe_bias else 0)
        shared += h if self.shared_expert_gate else 0
        if self.family == "gemma4":                       # router scale [H], per-expert scale [E], three norms [H]
            router += 4 * h + self.num_experts
        if self.latent_moe_size:                          # down and up projections, the latent norm
            router += 2 * h * lat + (lat if self.latent_moe_norm else 0)
        return (router + self.num_experts * expert + shared,
                router + self.num_experts_per_tok * expert + shared)

    def layer_params(self, i: int) -> tuple[int, int]:
        """(total, active per token) parameters of layer i, norms included."""
        if self.hybrid_pattern:                          # Nemotron-H: one block per layer (nemotron_config)
            return self.nemotron_layer_params(i)
        if self.is_linear(i):
            attn = self.linear_attention_params()
        elif self.is_kda_layer(i):
            attn = self.kda_params()
        elif self.attention == "v4":
            attn = _v4_attention_params(self, i)
        else:
            attn = self.attention_params(i)
            if self.attn_output_gate:                    # Qwen3.5: the q projection's gate rows
                attn += self.num_heads * self.head_dim * self.hidden_size
            if self.mla_output_gate:                     # Kimi-K3: g_proj
                attn += self.hidden_size * self.num_heads * self.v_head_dim
        if self.attn_res_block_size:
            attn += 4 * self.hidden_size                 # two (norm, proj) pairs of attention residuals
        a = attn + self.indexer_params(i) + self.msa_params(i) + (4 if self.sandwich_norms else 2) * self.hidden_size
        a += (2 * self.per_layer_input + 1) * self.hidden_size if self.per_layer_input else 0   # Gemma-4 per-layer in
        if self.layer_kind(i) == "dense":
            m = 3 * self.hidden_size * layer_intermediate(self, i)
            return a + m, a + m
        tot, act = self.moe_params()
        return a + tot, a + act

    def embedding_params(self) -> int:
        n = self.vocab_size * self.hidden_size
        lp = self.num_layers * self.per_layer_input        # Gemma-4 per-layer inputs: table, projection, norm
        ple = self.vocab_size * lp + lp * self.hidden_size + self.per_layer_input if lp else 0
        return (n if self.tie_word_embeddings else 2 * n) + ple

    def total_params(self) -> int:
        return sum(self.layer_params(i)[0] for i in range(self.num_layers)) + self.embedding_params() + self.hidden_size

    def active_params(self) -> int:
        return sum(self.layer_params(i)[1] for i in range(self.num_layers)) + self.embedding_params() + self.hidden_size

    # ---------------------------------------------------------------- memory accounting
    def weight_bytes_layer(self, i: int, dtype: str | None = None) -> float:
        return self.layer_params(i)[0] * DTYPE_BYTES[dtype or self.dtype]

    def kv_bytes_per_token_layer(self, dtype: str | None = None, layer: int | None = None) -> float:
        """KV cache bytes for one token in one layer: MLA stores the latent + rope key; a full DSA layer
        also the indexer's key (index_head_dim). ``layer`` None: the mean over the model's layers."""
        # linear (Qwen3.5) and KDA (Kimi) layers keep a per-sequence state (state_bytes_per_seq_layer), no per-token cache
        if self.hybrid_pattern:                          # Nemotron-H: K and V on its attention layers only
            return self.nemotron_kv_elems(layer) * DTYPE_BYTES[dtype or self.dtype]
        if self.linear_layers:
            full = [not self.is_linear(layer)] if layer is not None else [not x for x in self.linear_layers]
            return 2.0 * self.num_kv_heads * self.head_dim * sum(full) / len(full) * DTYPE_BYTES[dtype or self.dtype]
        if self.kda_layers:
            mla = [not self.is_kda_layer(layer)] if layer is not None else [not k for k in self.kda_layers]
            return float(self.kv_lora_rank + self.qk_rope_head_dim) * sum(mla) / len(mla) * DTYPE_BYTES[dtype or self.dtype]
        if self.attention == "v4":
            return _v4_kv_elems(self, layer) * DTYPE_BYTES[dtype or self.dtype]
        if self.attention == "mla":
            elems = float(self.kv_lora_rank + self.qk_rope_head_dim)
        elif self.window_kv_heads:                       # MiMo, Gemma-4: K and V heads of their own, per layer kind
            js = [layer] if layer is not None else range(self.num_layers)
            elems = float(sum(self.layer_kv_heads(j) * (self.layer_head_dim(j) + self.layer_v_head_dim(j))
                              for j in js if not kv_shared(self, j)) / len(js))     # Gemma-4: shared layers none
        else:
            elems = float(self.num_kv_heads * (self.head_dim + self.gqa_v_head_dim))
        if self.msa_layers:
            sparse = [self.block_sparse(layer)] if layer is not None else list(self.msa_layers)
            elems += self.msa_index_dim * sum(sparse) / len(sparse)
        if self.sparse_attention:
            full = ([self.indexer_kind(layer) == "full"] if layer is not None
                    else [self.indexer_kind(i) == "full" for i in range(self.num_layers)])
            elems += self.index_head_dim * sum(full) / len(full)
        return elems * DTYPE_BYTES[dtype or self.dtype]

    def state_bytes_per_seq_layer(self, layer: int) -> float:
        """Per sequence, layer ``layer``'s recurrent state (fp32) plus its conv state (model dtype), 0 for layers
        with a per-token cache: Gated DeltaNet [Hv, Dk, Dv] + [C, K - 1], KDA [H, Dk, Dv] + [3 H Dk, W - 1].
        (The cache holds these twice: the current state and the one a step writes, ``KVCache.state_next``.)"""
        if self.is_linear(layer):
            state = self.linear_num_v_heads * self.linear_k_dim * self.linear_v_dim * 4.0
            return state + self.linear_conv_dim * (self.linear_conv_kernel - 1) * DTYPE_BYTES[self.dtype]
        if self.is_mamba(layer):                         # Nemotron-H: SSM [Hm, P, N] + conv [C, K - 1]
            return self.nemotron_state_bytes(DTYPE_BYTES[self.dtype])
        if self.is_kda_layer(layer):
            n, d = self.kda_num_heads, self.kda_head_dim
            return 4.0 * n * d * d + 3 * n * d * (self.kda_conv_size - 1) * DTYPE_BYTES[self.dtype]
        return 0.0

    def weight_bytes(self, dtype: str | None = None) -> float:
        return self.total_params() * DTYPE_BYTES[dtype or self.dtype]

    def kv_bytes_per_token(self, dtype: str | None = None) -> float:
        return self.num_layers * self.kv_bytes_per_token_layer(dtype)

    def layers_that_fit(self, budget_bytes: float, tokens: int, start: int = 0) -> int:
        """How many consecutive layers from ``start`` fit weights + KV for ``tokens`` in budget."""
        used, n = 0.0, 0
        for i in range(start, self.num_layers):
            used += self.weight_bytes_layer(i) + tokens * self.kv_bytes_per_token_layer(layer=i) \
                + self.state_bytes_per_seq_layer(i)
            if used > budget_bytes:
                break
            n += 1
        return n


# ----------------------------------------------------------------------------- DeepSeek-V4 figures
def _v4_attention_params(spec: "SpecSizes", i: int | None) -> int:
    """Layer i's attention (None: the mean layer's): q_a/q_b with its norm, kv_proj + norm, sinks, grouped o_a
    and o_b, and on compressed layers the compressor (kv/gate [C, H], position bias [r, C], norm; C = 2 D on
    CSA) plus, on CSA, the indexer (its own compressor at Di, q_b [Hi Di, Lq], weights_proj [Hi, H]);
    each layer's hc_pre projections (2 blocks) are counted here too."""
    h, hq, d, lq, n = spec.hidden_size, spec.num_heads, spec.head_dim, spec.q_lora_rank, spec.hc_mult
    base = (h * lq + lq + lq * hq * d + h * d + d + hq + spec.o_groups * spec.o_lora_rank * (hq * d // spec.o_groups)
            + h * spec.o_groups * spec.o_lora_rank + 2 * ((2 + n) * n * (n * h + 1) + 3))
    ratios = [spec.compress_ratios[i]] if i is not None else list(spec.compress_ratios)

    def compressor(r: int, dim: int, overlap: bool) -> int:
        c = (2 if overlap else 1) * dim
        return 2 * c * h + r * c + dim
    extra = 0.0
    for r in ratios:
        if r:
            extra += compressor(r, d, r == spec.csa_ratio)
        if r and r == spec.csa_ratio:
            di, hi = spec.index_head_dim, spec.index_n_heads
            extra += compressor(r, di, True) + hi * di * lq + hi * h
    return int(base + extra / max(1, len(ratios)))


def _v4_kv_elems(spec: "SpecSizes", layer: int | None) -> float:
    """Cached elements per token of a DeepSeek-V4 layer (None: the mean): the K = V row (D); compressed layers
    their compressor's source rows (kv | gate, 2C) and 1/r of an entry (D); CSA layers also the indexer's rows
    (4 Di) and 1/r of its key (Di)."""
    ratios = [spec.compress_ratios[layer]] if layer is not None else list(spec.compress_ratios)
    d, di = spec.head_dim, spec.index_head_dim
    total = 0.0
    for r in ratios:
        total += d
        if r:
            csa = r == spec.csa_ratio
            total += 2 * (2 if csa else 1) * d + d / r
            if csa:
                total += 4 * di + di / r
    return total / max(1, len(ratios))
