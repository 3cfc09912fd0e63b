"""ModelSpec's structure queries, per layer (a mixin of ``spec.ModelSpec``, as ``spec_sizes.SpecSizes`` is for its
sizes): which attention, window, KV heads, head dims, mixer and MLP kind layer i has, and the fast tier's minimal
covering slice. Pure functions of the spec's fields; no torch.
"""

from __future__ import annotations

from persistent_engine.models.config_keys import SpecError

__all__ = ["SpecLayers"]


class SpecLayers:
    """Per-layer questions about a ``ModelSpec`` (its fields are the dataclass's)."""

    # ---------------------------------------------------------------- structure
    @property
    def attention(self) -> str:
        """'mla', 'gqa', or 'v4' (DeepSeek-V4's shared-KV window + compressed attention)."""
        if self.family == "deepseek_v4":
            return "v4"
        return "mla" if self.kv_lora_rank > 0 else "gqa"

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def sparse_attention(self) -> bool:
        """DeepSeek sparse attention: each query attends to the indexer's index_topk cached tokens (DeepSeek-V4's
        CSA indexer picks compressed entries instead: its own ops, not this)."""
        return self.index_topk > 0 and self.family != "deepseek_v4"

    def indexer_kind(self, i: int) -> str:
        """'full' (layer i runs the indexer), 'shared' (it reuses an earlier layer's selection) or ''
        (dense attention)."""
        if not self.sparse_attention:
            return ""
        return self.indexer_types[i] if self.indexer_types else "full"

    def indexer_source(self, i: int) -> int | None:
        """The layer whose top-k selection layer i attends with: i for a full layer, the last full
        layer before i for a shared one, None without sparse attention."""
        kind = self.indexer_kind(i)
        if kind != "shared":
            return i if kind else None
        return max(j for j in range(i) if self.indexer_kind(j) == "full")

    def layer_window(self, i: int) -> int:
        """Layer i's sliding window (tokens a query sees, itself included), 0 for full attention."""
        return self.layer_windows[i] if self.layer_windows else 0

    def layer_kv_heads(self, i: int) -> int:
        """Layer i's KV heads (MiMo-V2-Flash's windowed layers have their own count)."""
        return self.window_kv_heads if self.window_kv_heads and self.layer_window(i) else self.num_kv_heads

    def layer_head_dim(self, i: int) -> int:
        """Layer i's Q/K head dim (Gemma-4's full layers: global_head_dim)."""
        return self.global_head_dim if self.global_head_dim and not self.layer_window(i) else self.head_dim

    def layer_v_head_dim(self, i: int) -> int:
        return self.layer_head_dim(i) if self.global_head_dim else self.gqa_v_head_dim

    def kv_source(self, i: int) -> int:
        """The layer whose K/V cache layer i attends: i, or for Gemma-4's last kv_shared_layers layers the last
        earlier layer of the same kind."""
        first = self.num_layers - self.kv_shared_layers         # (a spec of shared layers only: i itself)
        return i if i < first else max((j for j in range(first) if self.layer_window(j) == self.layer_window(i)),
                                       default=i)

    def layer_k_eq_v(self, i: int) -> bool:
        """Whether layer i's V is its K projection (Gemma-4's full layers with attention_k_eq_v)."""
        return self.k_eq_v and not self.layer_window(i)

    def layer_sinks(self, i: int) -> bool:
        """Whether layer i's softmax has a learned sink logit per head."""
        return self.attention_sinks or (self.window_sinks and self.layer_window(i) > 0)

    @property
    def gqa_v_head_dim(self) -> int:
        """GQA V head dim (MiMo-V2-Flash: narrower than Q/K's head_dim; else head_dim)."""
        return self.v_head_dim if self.attention == "gqa" and self.v_head_dim else self.head_dim

    def attention_kinds(self) -> list[tuple[int, int, bool]]:
        """The distinct (KV heads, window, sinks) of the layers, sorted (the attention ops' shapes cover each)."""
        return sorted({(self.layer_kv_heads(i), self.layer_window(i), self.layer_sinks(i))
                       for i in range(self.num_layers)})

    def uses_rope(self, i: int) -> bool:
        """Whether layer i rotates q and k (Llama-4's NoPE layers do not)."""
        return not self.rope_layers or self.rope_layers[i]

    def is_linear(self, i: int) -> bool:
        """Whether layer i is a Gated DeltaNet (linear attention) layer (Qwen3.5)."""
        return bool(self.linear_layers) and self.linear_layers[i]

    @property
    def linear_conv_dim(self) -> int:
        """Channels of a linear layer's short conv: q, k (Hk Dk each) and v (Hv Dv)."""
        return 2 * self.linear_num_k_heads * self.linear_k_dim + self.linear_num_v_heads * self.linear_v_dim

    def is_kda_layer(self, i: int) -> bool:
        """Whether layer i runs Kimi delta attention (else its family's attention: MLA for kimi_linear)."""
        return bool(self.kda_layers) and self.kda_layers[i]

    def block_sparse(self, i: int) -> bool:
        """Whether layer i runs MiniMax-M3's block-sparse attention."""
        return bool(self.msa_layers) and self.msa_layers[i]

    def layer_kind(self, i: int) -> str:
        """'moe' or 'dense' for layer index i of the full model."""
        if self.mlp_layer_types:
            return self.mlp_layer_types[i]
        if not self.is_moe or i < self.first_k_dense:
            return "dense"
        if i in self.extra.get("mlp_only_layers", ()):
            return "dense"
        if self.moe_layer_freq > 1 and (i + 1) % self.moe_layer_freq != 0:
            return "dense"
        return "moe"

    def layer_kinds(self) -> list[str]:
        return [self.layer_kind(i) for i in range(self.num_layers)]

    def covering_layers(self) -> list[int]:
        """The fast tier's minimal slice: the first index of every distinct MLP kind and of every indexer
        kind, plus the full layer each shared layer in it takes its selection from."""
        seen: dict[str, int] = {}
        for i in range(self.num_layers):
            seen.setdefault("mlp:" + self.layer_kind(i), i)
            seen.setdefault("indexer:" + self.indexer_kind(i), i)
            seen.setdefault(f"msa:{self.block_sparse(i)}", i)
            seen.setdefault(f"window:{self.layer_window(i)}", i)
            seen.setdefault(f"rope:{self.uses_rope(i)}", i)
            seen.setdefault(f"linear:{self.is_linear(i)}:{self.layer_block(i)}", i)     # Nemotron-H: every block
            seen.setdefault(f"kda:{self.is_kda_layer(i)}:{self.layer_kind(i)}", i)
            seen.setdefault(f"kv:{self.kv_source(i) != i}:{self.layer_window(i)}", i)
            if self.compress_ratios:
                seen.setdefault(f"v4:{self.compress_ratios[i]}:{i < self.num_hash_layers}", i)
        out = set(seen.values())
        out |= {self.indexer_source(i) for i in list(out) if self.indexer_kind(i) == "shared"}
        return sorted(out | {self.kv_source(i) for i in out})

    def check_slice(self, layers: list[int]) -> None:
        """A slice must hold the full layer each of its shared-indexer layers takes its selection from."""
        have = set(layers)
        for i in layers:
            if self.kv_source(i) not in have:
                raise SpecError(f"{self.name}: layer {i} attends layer {self.kv_source(i)}'s K/V; a slice with "
                                f"layer {i} must include layer {self.kv_source(i)}")
            src = self.indexer_source(i)
            if src is not None and src not in have:
                raise SpecError(f"{self.name}: layer {i} reuses layer {src}'s sparse-attention selection; "
                                f"a slice with layer {i} must include layer {src}")

