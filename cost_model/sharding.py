"""How a layout shards each weight class, per serving framework, and the flags that launch it.

One table (``sharding``) says, for a ``Layout`` and the framework it is served with, how many ways each
weight class is split over the GPUs of one pipeline stage (1 = every GPU holds it whole). The memory
estimate (cost_model.layout), the op costs (cost_model.ops), the printed label, the JSON and the serving
flags all read it, so they cannot disagree.

What the frameworks do (read from their source; GPUs per stage = tp * dp):

  class            vLLM (--data-parallel-size dp)             SGLang (--tp-size tp*dp --dp-size dp
                                                              --enable-dp-attention)
  attention        tp (heads; GQA KV heads replicated once    tp (attn_tp = tp_size / dp_size)
                   tp > kv heads)
  MLA latent KV    dcp (--decode-context-parallel-size)       1 (no decode context parallel)
  dense MLP        tp (DP ranks run their own dense layers)   tp*dp (moe_dense_tp_size unset: the
                                                              whole tp_size; tokens gathered)
  routed experts   ep = tp*dp with --enable-expert-parallel,  ep = --ep-size (any divisor of tp_size),
                   else 1; each expert split tp*dp/ep ways    each expert split tp_size/ep ways
                   (FusedMoEParallelConfig flattens TP over   (parallel_state: moe_tp = tp // ep)
                   DP for the MoE layers)
  shared experts   tp; replicated (1) under sequence-         tp*dp (replicated only with a DeepEP
                   parallel MoE (EP, tp > 1, dp > 1 with the  a2a backend, which these flags do not
                   default all-to-all backend)                select)
  embedding        tp                                         1 under DP attention (VocabParallel-
                                                              Embedding(enable_tp=not dp_attention)),
                                                              else tp
  lm_head          tp                                         tp*dp (the whole tp_size)
  layers           pp stages                                  pp stages

vLLM's expert parallel is one switch over all tp*dp GPUs, so a layout with 1 < ep < tp*dp has no vLLM
flags; SGLang has no decode context parallel, so dcp > 1 has no SGLang flags (``serving_flags`` says why).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

FRAMEWORKS = ("vllm", "sglang")


@dataclass(frozen=True)
class Sharding:
    """Ways each weight class is split over the GPUs of one stage (1: replicated on each)."""
    attention: int
    kv: int                 # extra split of the MLA latent KV cache (decode context parallel)
    dense_mlp: int
    experts: int            # ep: the routed experts are spread over this many GPUs
    expert_tp: int          # each routed expert's width is split this many ways
    shared: int
    embedding: int
    lm_head: int
    stages: int             # pp

    def to_dict(self) -> dict:
        return asdict(self)


def sharding(layout) -> Sharding:
    """The sharding ``layout`` gets under ``layout.framework`` (table in the module docstring)."""
    tp, dp, ep = layout.tp, layout.dp, layout.ep
    group = tp * dp
    if layout.framework == "sglang":
        return Sharding(attention=tp, kv=1, dense_mlp=group, experts=ep, expert_tp=group // ep,
                        shared=group, embedding=1 if dp > 1 else tp, lm_head=group, stages=layout.pp)
    seq_parallel_moe = ep > 1 and tp > 1 and dp > 1
    return Sharding(attention=tp, kv=layout.dcp, dense_mlp=tp, experts=ep, expert_tp=group // ep,
                    shared=1 if seq_parallel_moe else tp, embedding=tp, lm_head=tp, stages=layout.pp)


def expressible(layout, framework: str | None = None) -> str | None:
    """Why ``framework`` (default: the layout's) cannot launch ``layout``; None when it can."""
    fw = framework or layout.framework
    group = layout.tp * layout.dp
    if fw == "vllm" and layout.ep not in (1, group):
        return (f"vLLM's --enable-expert-parallel spreads the experts over all tp*dp = {group} GPUs "
                f"of a stage; ep={layout.ep} would need an expert-parallel size of its own")
    if fw == "sglang" and layout.dcp > 1:
        return "SGLang has no decode context parallel (dcp); the MLA latent KV stays whole on each GPU"
    if fw not in FRAMEWORKS:
        return f"unknown framework {fw!r} (one of {', '.join(FRAMEWORKS)})"
    return None


KV_FLAG = {"vllm": {"bf16": None, "fp8": "fp8"}, "sglang": {"bf16": None, "fp8": "fp8_e4m3"}}


def serving_flags(layout, framework: str | None = None) -> list[str] | None:
    """The command-line flags that launch ``layout`` with ``framework`` (None when it cannot:
    ``expressible`` says why). Weight dtypes come from the checkpoint, not from these flags."""
    fw = framework or layout.framework
    if expressible(layout, fw) is not None:
        return None
    L = layout
    if fw == "vllm":
        out = ["--tensor-parallel-size", str(L.tp)]
        if L.pp > 1:
            out += ["--pipeline-parallel-size", str(L.pp)]
        if L.dp > 1:
            out += ["--data-parallel-size", str(L.dp)]
        if L.ep > 1:
            out += ["--enable-expert-parallel"]
        if L.dcp > 1:
            out += ["--decode-context-parallel-size", str(L.dcp)]
    else:
        out = ["--tp-size", str(L.tp * L.dp)]
        if L.dp > 1:
            out += ["--dp-size", str(L.dp), "--enable-dp-attention"]
        if L.ep > 1:
            out += ["--ep-size", str(L.ep)]
        if L.pp > 1:
            out += ["--pp-size", str(L.pp)]
    kv = KV_FLAG[fw].get(L.kv_dtype)
    if kv:
        out += ["--kv-cache-dtype", kv]
    return out


# flags each framework's parser knows: name -> (layout field it sets, takes a value)
_VLLM_ARGS = {"--tensor-parallel-size": "tp", "-tp": "tp", "--pipeline-parallel-size": "pp", "-pp": "pp",
              "--data-parallel-size": "dp", "-dp": "dp", "--decode-context-parallel-size": "dcp", "-dcp": "dcp",
              "--enable-expert-parallel": "ep!", "-ep": "ep!", "--kv-cache-dtype": "kv"}
_SGLANG_ARGS = {"--tp-size": "tp", "--tensor-parallel-size": "tp", "--dp-size": "dp", "--data-parallel-size": "dp",
                "--enable-dp-attention": "dpa!", "--ep-size": "ep", "--expert-parallel-size": "ep", "--ep": "ep",
                "--pp-size": "pp", "--pipeline-parallel-size": "pp", "--kv-cache-dtype": "kv"}


class FlagError(ValueError):
    pass


def parse_flags(framework: str, argv: list[str], dtype: str = "bf16"):
    """The ``Layout`` a framework builds from ``argv`` (its parallelism and KV-cache flags), read the
    way its own argument handling reads them. vLLM and SGLang are not installed here, so this is a
    parser of their spelled flags (aliases included), not theirs; the tests check it round-trips
    ``serving_flags``. SGLang's --tp-size counts every GPU of a stage: with DP attention the
    attention TP is tp_size / dp_size, without it --dp-size means separate replicas (an error here)."""
    from cost_model.layout import Layout

    table = _VLLM_ARGS if framework == "vllm" else _SGLANG_ARGS if framework == "sglang" else None
    if table is None:
        raise FlagError(f"unknown framework {framework!r}")
    got: dict = {}
    i = 0
    while i < len(argv):
        arg, val = argv[i], None
        if "=" in arg and arg.startswith("--"):
            arg, val = arg.split("=", 1)
        field = table.get(arg)
        if field is None:
            raise FlagError(f"{framework}: unknown flag {arg!r}")
        if field.endswith("!"):
            got[field[:-1]] = True
            i += 1
            continue
        if val is None:
            if i + 1 >= len(argv):
                raise FlagError(f"{framework}: {arg} needs a value")
            val, i = argv[i + 1], i + 2
        else:
            i += 1
        got[field] = val
    kv = {v: k for k, v in KV_FLAG[framework].items() if v}.get(got.get("kv"), "bf16")
    if "kv" in got and kv == "bf16" and got["kv"] not in ("auto", "bf16", "bfloat16"):
        raise FlagError(f"{framework}: unknown --kv-cache-dtype {got['kv']!r}")
    ints = {k: int(got.get(k, 1)) for k in ("tp", "pp", "dp", "dcp")}
    if framework == "vllm":
        group = ints["tp"] * ints["dp"]
        return Layout(tp=ints["tp"], pp=ints["pp"], dp=ints["dp"], dcp=ints["dcp"], ep=group if got.get("ep") else 1,
                      dtype=dtype, kv_dtype=kv, framework="vllm")
    tp_size, dp = ints["tp"], ints["dp"]
    if dp > 1 and not got.get("dpa"):
        raise FlagError("sglang: --dp-size without --enable-dp-attention runs separate replicas, not one layout")
    if tp_size % dp:
        raise FlagError(f"sglang: --dp-size {dp} must divide --tp-size {tp_size}")
    return Layout(tp=tp_size // dp, pp=ints["pp"], dp=dp, ep=int(got.get("ep", 1)), dtype=dtype, kv_dtype=kv,
                  framework="sglang")


def moe_label(layout) -> str:
    """The label's expert part: ``ep{E}`` when the experts are spread over E GPUs (each whole unless
    ``-etp{T}`` follows), ``etp{T}`` alone when each expert is split a different number of ways than
    attention (``tp2-dp36-etp72``: attention TP 2 in 36 DP groups,
    every expert split over all 72 GPUs)."""
    if layout.ep > 1:
        return f"ep{layout.ep}" + (f"-etp{layout.moe_tp}" if layout.moe_tp > 1 else "")
    return f"etp{layout.moe_tp}" if layout.moe_tp != layout.tp else ""
