"""Parallelism layouts and memory fit per GPU.

A ``Layout`` describes one model *instance* (a replica that holds the whole model):

    GPUs per instance = tp * dp * pp
    tp   tensor parallel inside one attention group (heads split; GQA KV split up to num_kv_heads)
    dp   DP-attention: dp attention groups of tp GPUs each hold their own sequences and KV
    pp   pipeline stages (consecutive layers), pp micro-batches in flight
    ep   expert parallel for MoE layers: experts split over ep of the tp*dp GPUs of a stage,
         each expert further split tensor-parallel over (tp*dp)/ep GPUs; ep == 1 is pure TP
    dcp  decode context parallel (MLA): the latent KV cache split over dcp of the tp GPUs, which
         otherwise each hold a full copy (MLA's KV has one shared "head")

Rank order is tp innermost, then dp, then pp: a group of n consecutive ranks stays inside the
scale-up domain when n <= hw.domain.

Memory per GPU (bytes, the fullest pipeline stage): weights of its layers at the weight dtype
(attention and MLP projections; embeddings, lm_head, norms and the router stay bf16), KV for the
sequences in flight, activations of the largest step, communication buffers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from cost_model.hardware import DTYPE_BYTES, CostModelError, Hardware

ACT_BYTES = 2.0            # activations in bf16


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    pp: int = 1
    ep: int = 1
    dp: int = 1
    dcp: int = 1
    dtype: str = "bf16"            # weight dtype of the linear layers: bf16 | fp8 | fp4
    kv_dtype: str = "bf16"

    def __post_init__(self):
        for k in ("tp", "pp", "ep", "dp", "dcp"):
            if int(getattr(self, k)) < 1:
                raise CostModelError(f"layout {k} must be >= 1, got {getattr(self, k)}")
        if (self.tp * self.dp) % self.ep:
            raise CostModelError(f"ep={self.ep} must divide tp*dp={self.tp * self.dp}")
        if self.tp % self.dcp:
            raise CostModelError(f"dcp={self.dcp} must divide tp={self.tp}")
        if self.dtype not in DTYPE_BYTES or self.kv_dtype not in DTYPE_BYTES:
            raise CostModelError(f"unknown dtype {self.dtype!r} / {self.kv_dtype!r}")

    @property
    def gpus(self) -> int:
        return self.tp * self.dp * self.pp

    @property
    def mlp_group(self) -> int:
        """GPUs that share one stage's MLP / experts."""
        return self.tp * self.dp

    @property
    def moe_tp(self) -> int:
        return self.mlp_group // self.ep

    @property
    def wbytes(self) -> float:
        return DTYPE_BYTES[self.dtype]

    @property
    def kvbytes(self) -> float:
        return DTYPE_BYTES[self.kv_dtype]

    def label(self) -> str:
        parts = [f"tp{self.tp}"]
        for k in ("dp", "ep", "pp", "dcp"):
            if getattr(self, k) > 1:
                parts.append(f"{k}{getattr(self, k)}")
        return "-".join(parts) + f" {self.dtype}"

    def to_dict(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------ per-GPU shapes
def heads_per_gpu(spec, layout: Layout) -> tuple[int, int]:
    """(query heads, kv heads) one GPU of an attention group holds; GQA KV heads are replicated
    once tp exceeds num_kv_heads; MLA's latent is one shared "head" (reported as 1)."""
    hq = _ceil_div(spec.num_heads, layout.tp)
    if spec.attention == "mla":
        return hq, 1
    return hq, max(1, round(mean_kv_heads_gpu(spec, layout)))


def mean_kv_heads_gpu(spec, layout: Layout) -> float:
    """GQA KV heads one GPU holds, averaged over the layers (MiMo-V2-Flash's windowed layers have their own count)."""
    if not getattr(spec, "window_kv_heads", 0):
        return float(_ceil_div(spec.num_kv_heads, layout.tp))
    return sum(_ceil_div(spec.layer_kv_heads(i), layout.tp) for i in range(spec.num_layers)) / spec.num_layers


def kv_bytes_per_token_layer_gpu(spec, layout: Layout) -> float:
    """KV bytes one GPU stores per token per layer."""
    if spec.attention == "v4":      # DeepSeek-V4: one shared K = V head + compressor rows, replicated over TP
        return spec.kv_bytes_per_token_layer("fp32") / 4.0 * layout.kvbytes
    if spec.attention == "mla":
        return (spec.kv_lora_rank + spec.qk_rope_head_dim) * layout.kvbytes / layout.dcp
    if getattr(spec, "global_head_dim", 0):         # Gemma-4: the mean over its layer kinds
        return sum(f * kv_bytes_per_token_layer_gpu(s, layout) for f, s in _layer_kinds(spec))
    if 0 < spec.num_layers <= getattr(spec, "kv_shared_layers", 0):    # Gemma-4 layers reading an earlier cache
        return 0.0
    return mean_kv_heads_gpu(spec, layout) * (spec.head_dim + spec.gqa_v_head_dim) * layout.kvbytes


def _layer_kinds(spec) -> list:
    from persistent_engine.models.spec import layer_kind_specs     # Gemma-4's layer kinds (models/gemma4_config.py)

    return layer_kind_specs(spec)


def attention_weight_bytes_gpu(spec, layout: Layout) -> float:
    h, wb = spec.hidden_size, layout.wbytes
    hq, hk = heads_per_gpu(spec, layout)
    if spec.attention == "v4":      # DeepSeek-V4: counted whole on every GPU of the group (an upper bound)
        return spec.attention_params() * wb
    if spec.attention == "mla":
        qk = spec.qk_nope_head_dim + spec.qk_rope_head_dim
        q = (h * spec.q_lora_rank + spec.q_lora_rank * hq * qk) if spec.q_lora_rank else h * hq * qk
        kv = h * (spec.kv_lora_rank + spec.qk_rope_head_dim) + spec.kv_lora_rank * hq * (
            spec.qk_nope_head_dim + spec.v_head_dim)
        return (q + kv + hq * spec.v_head_dim * h) * wb
    if getattr(spec, "global_head_dim", 0):         # Gemma-4: the mean over its layer kinds
        return sum(f * attention_weight_bytes_gpu(s, layout) for f, s in _layer_kinds(spec))
    hk_mean, dh, dv = mean_kv_heads_gpu(spec, layout), spec.head_dim, spec.gqa_v_head_dim
    kv = dh if getattr(spec, "k_eq_v", False) else dh + dv                      # Gemma-4 full layers: V = K
    kv = 0 if 0 < spec.num_layers <= getattr(spec, "kv_shared_layers", 0) else kv   # Gemma-4: q only
    ple = 2 * h * getattr(spec, "per_layer_input", 0)                           # Gemma-4 per-layer input gate, out
    return (h * (hq * dh + hk_mean * kv) + hq * dv * h + ple) * wb


def mlp_weight_bytes_gpu(spec, layout: Layout, kind: str) -> float:
    if getattr(spec, "global_head_dim", 0):         # Gemma-4: double-wide MLPs on the K/V-sharing layers
        return sum(f * mlp_weight_bytes_gpu(s, layout, kind) for f, s in _layer_kinds(spec))
    h, wb = spec.hidden_size, layout.wbytes
    if kind == "dense":
        return 3 * h * spec.intermediate_size * wb / layout.mlp_group
    experts = _ceil_div(spec.num_experts, layout.ep) * 3 * h * spec.moe_intermediate_size / layout.moe_tp
    shared = 3 * h * spec.shared_intermediate_size * spec.num_shared_experts
    shared = shared if layout.ep > 1 else shared / layout.mlp_group   # replicated under EP
    router = h * spec.num_experts * ACT_BYTES
    return (experts + shared) * wb + router


def layer_weight_bytes_gpu(spec, layout: Layout, kind: str) -> float:
    return attention_weight_bytes_gpu(spec, layout) + mlp_weight_bytes_gpu(spec, layout, kind) \
        + 2 * spec.hidden_size * ACT_BYTES


def stage_layers(spec, layout: Layout, stage: int, layers: list[int] | None = None) -> list[int]:
    idx = list(range(spec.num_layers)) if layers is None else list(layers)
    per = _ceil_div(len(idx), layout.pp)
    return idx[stage * per:(stage + 1) * per]


# ------------------------------------------------------------------ memory fit
@dataclass(frozen=True)
class MemoryFit:
    weights: float          # bytes per GPU, fullest stage
    kv: float
    activations: float
    comm_buffers: float
    capacity: float         # usable bytes per GPU
    batch: int              # sequences per instance the KV figure is for
    context: int            # tokens per sequence the KV figure is for

    @property
    def total(self) -> float:
        return self.weights + self.kv + self.activations + self.comm_buffers

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    def to_dict(self) -> dict:
        gb = 1e9
        return {"weights_gb": round(self.weights / gb, 3), "kv_gb": round(self.kv / gb, 3),
                "activations_gb": round(self.activations / gb, 3),
                "comm_buffers_gb": round(self.comm_buffers / gb, 3), "total_gb": round(self.total / gb, 3),
                "capacity_gb": round(self.capacity / gb, 3), "fits": self.fits}


def _activation_bytes(spec, layout: Layout, tokens: int, rows: int) -> float:
    """Peak activation memory of one step of ``tokens`` tokens per attention group and ``rows``
    logits rows: residual + normed + attention in/out (~6 H), the widest MLP intermediate, the
    fp32 logits shard, and the EP dispatch buffer."""
    h = spec.hidden_size
    hq, hk = heads_per_gpu(spec, layout)
    dh = max(spec.head_dim, getattr(spec, "global_head_dim", 0))         # Gemma-4: its widest (full) layers
    qkv = (hq + hk) * dh + hk * max(dh, spec.gqa_v_head_dim)             # gqa_v_head_dim: head_dim but MiMo
    inter = 2 * max(spec.intermediate_size / layout.mlp_group,
                    spec.num_experts_per_tok * spec.moe_intermediate_size / layout.moe_tp if spec.is_moe else 0)
    act = tokens * (6 * h + qkv + inter) * ACT_BYTES
    act += rows * spec.vocab_size / layout.tp * 4
    if spec.is_moe and layout.ep > 1:
        act += tokens * layout.dp * spec.num_experts_per_tok * h * ACT_BYTES / layout.ep * 2
    return act


def weight_bytes_gpu(spec, layout: Layout, layers: list[int] | None = None) -> float:
    """Weight bytes on the fullest GPU: per stage, its layers plus the vocab-parallel embedding
    (first stage) and lm_head (last stage; shared with the embedding when tied and pp == 1)."""
    emb = spec.vocab_size * spec.hidden_size * ACT_BYTES / layout.tp
    lp = spec.num_layers * getattr(spec, "per_layer_input", 0)       # Gemma-4 per-layer input table and projection
    worst = 0.0
    for s in range(layout.pp):
        w = sum(layer_weight_bytes_gpu(spec, layout, spec.layer_kind(i)) for i in stage_layers(spec, layout, s, layers))
        if s == 0:
            w += emb + lp * (spec.vocab_size / layout.tp + spec.hidden_size) * ACT_BYTES
        if s == layout.pp - 1 and not (spec.tie_word_embeddings and layout.pp == 1):
            w += emb + spec.hidden_size * ACT_BYTES
        worst = max(worst, w)
    return worst


def kv_bytes_per_seq_gpu(spec, layout: Layout, context: int, layers: list[int] | None = None) -> float:
    """KV bytes one sequence of ``context`` tokens puts on each GPU of its group (fullest stage)."""
    n = max(len(stage_layers(spec, layout, s, layers)) for s in range(layout.pp))
    return context * n * kv_bytes_per_token_layer_gpu(spec, layout)


def memory_fit(spec, hw: Hardware, layout: Layout, batch: int, context: int, chunk: int = 8192,
               layers: list[int] | None = None) -> MemoryFit:
    """Memory per GPU for ``batch`` sequences per instance (per micro-batch; pp micro-batches are
    in flight) of ``context`` tokens each, with prefill chunks of ``chunk`` tokens."""
    seqs_per_group = _ceil_div(max(batch, 1), layout.dp) * layout.pp
    kv = seqs_per_group * kv_bytes_per_seq_gpu(spec, layout, context, layers)
    tokens = max(chunk, _ceil_div(max(batch, 1), layout.dp))
    act = _activation_bytes(spec, layout, tokens, _ceil_div(max(batch, 1), layout.dp))
    comm = hw.comm_buffer_bytes if layout.gpus > 1 else 0.0
    return MemoryFit(weights=weight_bytes_gpu(spec, layout, layers), kv=kv, activations=act,
                     comm_buffers=comm, capacity=hw.usable_bytes, batch=batch, context=context)


def max_batch(spec, hw: Hardware, layout: Layout, context: int, chunk: int = 8192,
              layers: list[int] | None = None) -> int:
    """Largest per-micro-batch instance batch whose KV fits next to weights, activations and
    buffers (0 when even one sequence does not fit). Activations grow with the batch only
    through the logits rows, so one refinement step suffices."""
    base = memory_fit(spec, hw, layout, 1, context, chunk, layers)
    per_seq = kv_bytes_per_seq_gpu(spec, layout, context, layers) * layout.pp
    free = hw.usable_bytes - (base.total - base.kv)
    if free < per_seq:
        return 0
    b = int(free // per_seq) * layout.dp
    while b > 0 and not memory_fit(spec, hw, layout, b, context, chunk, layers).fits:
        b = int(b * 0.97) if b > 64 else b - 1
    return max(b, 0)


def layout_is_valid(spec, layout: Layout) -> str | None:
    """Why ``layout`` cannot run ``spec`` (None when it can)."""
    if layout.pp > spec.num_layers:
        return f"pp={layout.pp} exceeds {spec.num_layers} layers"
    if not spec.is_moe and (layout.ep > 1 or layout.dp > 1):
        return "ep and DP-attention apply to MoE models only"
    if layout.dcp > 1 and spec.attention != "mla":
        return "dcp applies to MLA attention only"
    if layout.ep > spec.num_experts > 0:
        return f"ep={layout.ep} exceeds {spec.num_experts} experts"
    if layout.tp > spec.num_heads:
        return f"tp={layout.tp} exceeds {spec.num_heads} heads"
    return None

