"""Parallelism layouts and memory fit per GPU.

A ``Layout`` describes one model *instance* (a replica that holds the whole model):

    GPUs per instance = tp * dp * pp
    tp   tensor parallel inside one attention group (heads split; GQA KV split up to num_kv_heads)
    dp   DP-attention: dp attention groups of tp GPUs each hold their own sequences and KV
    pp   pipeline stages (consecutive layers), pp micro-batches in flight
    ep   expert parallel for MoE layers: experts split over ep of the tp*dp GPUs of a stage,
         each expert further split tensor-parallel over (tp*dp)/ep GPUs (``moe_tp``); with ep == 1
         every expert is split over all tp*dp GPUs (vLLM and SGLang both do this with DP attention)
    dcp  decode context parallel (MLA): the latent KV cache split over dcp of the tp GPUs, which
         otherwise each hold a full copy (MLA's KV has one shared "head")
    framework  vllm | sglang: how the other weight classes (dense MLP, shared experts, embedding,
         lm_head) are sharded follows the framework (cost_model.sharding, one table for the memory
         estimate, the op costs, the label, the JSON and the serving flags)

Rank order is tp innermost, then dp, then pp: a group of n consecutive ranks stays inside the
scale-up domain when n <= hw.domain.

Memory per GPU (bytes, the fullest pipeline stage): weights of its layers at the weight dtype
(attention and MLP projections; embeddings, lm_head, norms and the router stay bf16), each weight class
divided by its sharding (parameter counts from the spec's own SpecSizes), KV for the sequences in
flight, activations of the largest step, communication buffers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from cost_model.hardware import DTYPE_BYTES, CostModelError, Hardware
from cost_model.sharding import FRAMEWORKS, Sharding, moe_label, sharding

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
    framework: str = "vllm"        # whose sharding of the non-expert classes (cost_model.sharding)

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
        if self.framework not in FRAMEWORKS:
            raise CostModelError(f"unknown framework {self.framework!r} (one of {', '.join(FRAMEWORKS)})")

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

    @property
    def sharding(self) -> Sharding:
        return sharding(self)

    def label(self) -> str:
        """``tp{T}[-dp{D}][-ep{E}][-etp{X}][-pp{P}][-dcp{C}] {dtype}``: ``etp`` how many ways each routed
        expert is split when that differs from tp (cost_model.sharding.moe_label)."""
        parts = [f"tp{self.tp}"] + ([f"dp{self.dp}"] if self.dp > 1 else [])
        parts += [moe_label(self)] if moe_label(self) else []
        parts += [f"{k}{getattr(self, k)}" for k in ("pp", "dcp") if getattr(self, k) > 1]
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
        return (spec.kv_lora_rank + spec.qk_rope_head_dim) * layout.kvbytes / layout.sharding.kv
    if getattr(spec, "global_head_dim", 0):         # Gemma-4: the mean over its layer kinds
        return sum(f * kv_bytes_per_token_layer_gpu(s, layout) for f, s in _layer_kinds(spec))
    if 0 < spec.num_layers <= getattr(spec, "kv_shared_layers", 0):    # Gemma-4 layers reading an earlier cache
        return 0.0
    return mean_kv_heads_gpu(spec, layout) * (spec.head_dim + spec.gqa_v_head_dim) * layout.kvbytes


def _layer_kinds(spec) -> list:
    from persistent_engine.models.spec import layer_kind_specs     # Gemma-4's layer kinds (models/gemma4_config.py)

    return layer_kind_specs(spec)


def _projection_params_gpu(spec, layout: Layout) -> float:
    """Attention projection parameters one GPU holds (mean layer): heads split tp ways; MLA's q_a and
    kv_a (ReplicatedLinear in vLLM) and GQA KV heads beyond num_kv_heads replicated; Gemma-4: the mean
    over its layer kinds (full layers' wider heads, V = K, q-only K/V-sharing layers)."""
    if getattr(spec, "global_head_dim", 0):
        return sum(f * _projection_params_gpu(s, layout) for f, s in _layer_kinds(spec))
    h = spec.hidden_size
    hq, hk = heads_per_gpu(spec, layout)
    if spec.attention == "mla":
        qk = spec.qk_nope_head_dim + spec.qk_rope_head_dim
        q = (h * spec.q_lora_rank + spec.q_lora_rank * hq * qk) if spec.q_lora_rank else h * hq * qk
        kv = h * (spec.kv_lora_rank + spec.qk_rope_head_dim) + spec.kv_lora_rank * hq * (
            spec.qk_nope_head_dim + spec.v_head_dim)
        return q + kv + hq * spec.v_head_dim * h
    hk_mean, dh, dv = mean_kv_heads_gpu(spec, layout), spec.head_dim, spec.gqa_v_head_dim
    kv = dh if getattr(spec, "k_eq_v", False) else dh + dv                      # Gemma-4 full layers: V = K
    kv = 0 if 0 < spec.num_layers <= getattr(spec, "kv_shared_layers", 0) else kv   # Gemma-4: q only
    ple = 2 * h * getattr(spec, "per_layer_input", 0)                           # Gemma-4 per-layer input gate, out
    return h * (hq * dh + hk_mean * kv) + hq * dv * h + ple


_CACHE: dict = {}


def _per_spec(fn):
    """Memoise ``fn(spec, *args)`` per spec value (specs holding dicts are keyed by their repr)."""
    def wrapped(spec, *args):
        try:
            key = (fn.__name__, hash(spec), spec, args)
        except TypeError:
            key = (fn.__name__, repr(spec), args)
        if key not in _CACHE:
            if len(_CACHE) > 65536:
                _CACHE.clear()
            _CACHE[key] = fn(spec, *args)
        return _CACHE[key]
    wrapped.__doc__ = fn.__doc__
    return wrapped


@_per_spec
def _projection_params_tp(spec, tp: int) -> float:
    return _projection_params_gpu(spec, Layout(tp=tp))


@_per_spec
def _layer_table(spec) -> tuple:
    """Per layer: (attention-block parameters = layer_params minus its MLP, kind, linear/KDA mixer)."""
    out = []
    for i in range(spec.num_layers):
        kind = spec.layer_kind(i)
        mlp = spec.dense_mlp_params() if kind == "dense" else spec.moe_params()[0]
        out.append((spec.layer_params(i)[0] - mlp, kind, spec.is_linear(i) or spec.is_kda_layer(i)))
    return tuple(out)


def attention_weight_bytes_gpu(spec, layout: Layout) -> float:
    """Attention projection bytes of the mean layer on one GPU (v4: the whole block, an upper bound)."""
    if spec.attention == "v4":
        return spec.attention_params() * layout.wbytes
    return _projection_params_gpu(spec, layout) * layout.wbytes


def _gate_params(spec) -> int:
    """Output-gate projections split with the heads: Kimi-K3's g_proj, Qwen3.5's q-projection gate rows."""
    n = spec.hidden_size * spec.num_heads * spec.v_head_dim if getattr(spec, "mla_output_gate", False) else 0
    return n + (spec.num_heads * spec.head_dim * spec.hidden_size if getattr(spec, "attn_output_gate", False) else 0)


def _attention_bytes(spec, layout: Layout, block: float, recurrent: bool, proj: tuple, split: int) -> float:
    """One attention block of ``block`` parameters (``spec.layer_params(i)`` less the layer's MLP) on one
    GPU; ``proj``: (projection parameters per GPU, at tp 1, output-gate parameters); ``split``:
    sharding.attention. Linear / KDA mixers split with their heads; softmax attention: the projections as ``_projection_params_gpu``, the
    output gate / tp, the rest (indexers, norms, biases, sinks) whole on every GPU in bf16 (an upper
    bound: vLLM replicates the DSA indexer)."""
    wb = layout.wbytes
    if spec.attention == "v4":
        return block * wb
    if recurrent:
        return block * wb / split
    per_gpu, whole, gate = proj
    return (per_gpu + gate / split) * wb + max(0.0, block - whole - gate) * max(wb, ACT_BYTES)


@_per_spec
def _moe_total(spec) -> int:
    return spec.moe_params()[0]


def expert_wbytes(spec, layout: Layout) -> float:
    """Bytes per routed-expert weight: the layout's, or MXFP4's 4.25 bits (e2m1 values + an e8m0 scale per 32) where
    the checkpoint ships MXFP4 experts (gpt-oss, ``expert_dtype`` mxfp4) and the layout's dtype is wider."""
    return min(layout.wbytes, 4.25 / 8) if getattr(spec, "expert_dtype", "bf16") == "mxfp4" else layout.wbytes


def mlp_weight_bytes_gpu(spec, layout: Layout, kind: str) -> float:
    """One layer's MLP on one GPU: a dense MLP / sharding.dense_mlp; MoE: ceil(E/ep) routed experts at
    the latent width (Kimi-K3) or hidden, each / expert_tp; shared experts / sharding.shared; router,
    latent projections and shared gate whole in bf16 (replicated in vLLM and AIConfigurator)."""
    if getattr(spec, "global_head_dim", 0):         # Gemma-4: double-wide MLPs on the K/V-sharing layers
        return sum(f * mlp_weight_bytes_gpu(s, layout, kind) for f, s in _layer_kinds(spec))
    sh, wb, h = layout.sharding, layout.wbytes, spec.hidden_size
    if kind == "dense":
        return spec.dense_mlp_params() * wb / sh.dense_mlp
    expert = 3 * (spec.latent_moe_size or h) * spec.moe_intermediate_size
    shared = 3 * h * spec.shared_intermediate_size * spec.num_shared_experts
    rest = _moe_total(spec) - spec.num_experts * expert - shared
    experts = _ceil_div(spec.num_experts, sh.experts) * expert / sh.expert_tp   # MXFP4 experts: 4.25 bits
    return experts * expert_wbytes(spec, layout) + shared / sh.shared * wb + rest * max(wb, ACT_BYTES)


def _stage_layer_bytes(spec, layout: Layout, idx: list[int]) -> float:
    """Weight bytes of layers ``idx`` on one GPU: each layer's attention block (``_attention_bytes``) and
    MLP (``mlp_weight_bytes_gpu``, once per kind); Nemotron-H: one block a layer (``cost_model.ops_mamba``)."""
    if getattr(spec, "hybrid_pattern", ""):
        from cost_model.ops_mamba import nemotron_layer_weight_bytes_gpu

        return sum(nemotron_layer_weight_bytes_gpu(spec, layout, i) for i in idx)
    if getattr(spec, "global_head_dim", 0):      # Gemma-4: the mean layer over its kinds, each costed whole
        return len(idx) * sum(f * _stage_layer_bytes(s, layout, [0]) for f, s in _layer_kinds(spec))
    table = _layer_table(spec)
    proj = (_projection_params_tp(spec, layout.tp), _projection_params_tp(spec, 1), _gate_params(spec))
    mlp = {k: mlp_weight_bytes_gpu(spec, layout, k) for k in {table[i][1] for i in idx}}
    split = layout.sharding.attention
    return sum(_attention_bytes(spec, layout, table[i][0], table[i][2], proj, split) + mlp[table[i][1]] for i in idx)


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
    # a dense MLP holds tokens * I / tp elements per GPU in both frameworks (vLLM: its group's tokens
    # over tp; SGLang: all dp groups' tokens over tp * dp)
    inter = 2 * max(spec.intermediate_size / layout.tp,
                    spec.num_experts_per_tok * spec.moe_intermediate_size / layout.moe_tp if spec.is_moe else 0)
    act = tokens * (6 * h + qkv + inter) * ACT_BYTES
    act += rows * spec.vocab_size / layout.tp * 4
    if spec.is_moe and layout.ep > 1:
        act += tokens * layout.dp * spec.num_experts_per_tok * h * ACT_BYTES / layout.ep * 2
    return act


def weight_bytes_gpu(spec, layout: Layout, layers: list[int] | None = None) -> float:
    return _weight_bytes(spec, layout, None if layers is None else tuple(layers))


@_per_spec
def _weight_bytes(spec, layout: Layout, layers: tuple | None) -> float:
    """Weight bytes on the fullest GPU: per stage, its layers plus the vocab-parallel embedding
    (first stage, / sharding.embedding) and lm_head with the final norm (last stage, / sharding.lm_head;
    one table when tied and pp == 1, at the finer of the two splits' memory: the coarser divisor)."""
    sh = layout.sharding
    table = spec.vocab_size * spec.hidden_size * ACT_BYTES
    lp = spec.num_layers * getattr(spec, "per_layer_input", 0)       # Gemma-4 per-layer input table and projection
    worst = 0.0
    for s in range(layout.pp):
        w = _stage_layer_bytes(spec, layout, stage_layers(spec, layout, s, layers))
        if spec.tie_word_embeddings and layout.pp == 1:
            w += table / min(sh.embedding, sh.lm_head) + spec.hidden_size * ACT_BYTES
        else:
            w += table / sh.embedding if s == 0 else 0.0
            w += table / sh.lm_head + spec.hidden_size * ACT_BYTES if s == layout.pp - 1 else 0.0
        w += lp * (spec.vocab_size / sh.embedding + spec.hidden_size) * ACT_BYTES if s == 0 else 0.0
        worst = max(worst, w)
    return worst


def _recurrent(spec, i: int) -> bool:
    return bool(getattr(spec, "linear_layers", ()) and spec.is_linear(i)
                or getattr(spec, "kda_layers", ()) and spec.is_kda_layer(i))


@_per_spec
def _kv_table(spec) -> tuple:
    """Per layer: (elements of its per-token cache, KV heads among them (0: MLA / V4), recurrent state
    bytes per sequence (linear / KDA layers, which keep no per-token cache))."""
    out = []
    for i in range(spec.num_layers):
        if _recurrent(spec, i):
            out.append((0.0, 0, spec.state_bytes_per_seq_layer(i)))
            continue
        hk = 0 if spec.attention in ("mla", "v4") else (
            spec.layer_kv_heads(i) if getattr(spec, "window_kv_heads", 0) else spec.num_kv_heads)
        out.append((spec.kv_bytes_per_token_layer("fp32", layer=i) / 4.0, hk, 0.0))
    return tuple(out)


def kv_bytes_per_seq_gpu(spec, layout: Layout, context: int, layers: list[int] | None = None) -> float:
    """KV bytes one sequence of ``context`` tokens puts on each GPU of its group (fullest stage): per
    attention layer its per-token cache (GQA heads split tp ways, replicated past the KV head count;
    MLA's latent split dcp ways; indexer keys whole), per linear / KDA layer its recurrent state (heads
    split tp ways)."""
    if getattr(spec, "hybrid_pattern", ""):        # Nemotron-H: K/V of its attention layers + Mamba states
        from cost_model.ops_mamba import nemotron_seq_bytes_gpu

        return nemotron_seq_bytes_gpu(spec, layout, context, layers)
    return _kv_per_seq(spec, layout, context, None if layers is None else tuple(layers))


@_per_spec
def _kv_per_seq(spec, layout: Layout, context: int, layers: tuple | None) -> float:
    table, kvb, kv_split = _kv_table(spec), layout.kvbytes, layout.sharding.kv
    latent = spec.kv_lora_rank + spec.qk_rope_head_dim if spec.attention == "mla" else 0
    head_elems = spec.head_dim + spec.gqa_v_head_dim

    def per_token(elems: float, hk: int) -> float:
        if hk:
            return elems - hk * head_elems + _ceil_div(hk, layout.tp) * head_elems
        return elems - latent + latent / kv_split

    worst = 0.0
    for s in range(layout.pp):
        idx = stage_layers(spec, layout, s, layers)
        tok = sum(per_token(table[i][0], table[i][1]) for i in idx if table[i][0])
        worst = max(worst, context * tok * kvb + sum(table[i][2] for i in idx) / layout.tp)
    return worst


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
    if spec.is_moe and spec.num_experts % layout.ep:
        return f"ep={layout.ep} does not divide {spec.num_experts} experts"
    if layout.tp > spec.num_heads:
        return f"tp={layout.tp} exceeds {spec.num_heads} heads"
    if spec.num_heads % layout.tp:      # vLLM and SGLang split the query heads evenly
        return f"tp={layout.tp} does not divide {spec.num_heads} heads"
    hk = spec.num_kv_heads
    if spec.attention == "gqa" and hk % layout.tp and layout.tp % hk:
        return f"tp={layout.tp} neither divides nor is a multiple of {hk} KV heads"
    return None

