"""``tkcc cost op OP --hw H [--dtype D] [key=value ...] [--json]``: one op's modelled latency.

    tkcc cost op gemm --hw h200 m=16 n=4096 k=4096
    tkcc cost op moe --hw b200 --dtype fp8 tokens=64 hidden=7168 inter=2048 topk=8 experts=256 ep=8 skew=1.2
    tkcc cost op attention_decode --hw h100 --dtype fp8 batch=64 ctx=4096 heads=32 kv_heads=8 head_dim=128
    tkcc cost op mla_decode --hw h200 batch=32 ctx=8192 heads=16 kv_dtype=fp8
    tkcc cost op dsa_decode --hw b200 batch=64 ctx=65536 heads=16      # DeepSeek-V3.2 sparse attention
    tkcc cost op allreduce --hw gb200 bytes=16777216 gpus=72 --json

The latency comes from the per-op efficiency curves of ``cost_model.efficiency`` (fitted on measured
vLLM kernels on H100/H200, transferred to other GPUs by their datasheet compute and bandwidth);
``mla_decode`` / ``dsa_decode`` are one layer's whole attention module in decode (DeepSeek-V3 /
DeepSeek-V3.2 geometry, ``heads`` query heads on this GPU). ``--json`` prints one object with ``latency_ms``, ``roofline_ms``, ``efficiency``, ``bound`` and how
the figure was calibrated. ``--dtype``: weights (gemm, moe, mla_decode: bf16 | fp8 | fp8_block |
fp4) or the KV cache (attention: bf16 | fp8). A bad op, key or number is one line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys

# op -> (required keys, optional keys with defaults)
OPS = {
    "gemm": (("m", "n", "k"), {}),
    "moe": (("tokens", "hidden", "inter", "topk", "experts"), {"tp": 1, "ep": 1, "skew": 0.0}),
    "attention_decode": (("batch", "ctx", "heads", "kv_heads", "head_dim"), {"window": 0}),
    "attention_prefill": (("batch", "isl", "heads", "kv_heads", "head_dim"), {"window": 0}),
    "mla_decode": (("batch", "ctx"), {"heads": 128, "kv_dtype": "bf16"}),
    "dsa_decode": (("batch", "ctx"), {"heads": 128, "kv_dtype": "bf16"}),
    "allreduce": (("bytes", "gpus"), {}),
    "allgather": (("bytes", "gpus"), {}),
    "alltoall": (("bytes", "gpus"), {}),
    "reducescatter": (("bytes", "gpus"), {}),
}
COLLECTIVE = {"allreduce": "all_reduce", "allgather": "all_gather", "alltoall": "all_to_all",
              "reducescatter": "reduce_scatter"}
DTYPES = {"gemm": ("bf16", "fp8", "fp8_block", "fp4"), "moe": ("bf16", "fp8", "fp8_block", "fp4"),
          "attention_decode": ("bf16", "fp8"), "attention_prefill": ("bf16", "fp8"), "mla_decode": ("bf16", "fp8"),
          "dsa_decode": ("bf16", "fp8")}
FLOAT_KEYS = ("skew", "bytes")


def register(sub) -> None:
    p = sub.add_parser("cost", help="the cost model's figures for one op")
    s = p.add_subparsers(dest="cost_command", metavar="WHAT")
    s.required = True
    op = s.add_parser("op", help="one op's modelled latency at one shape")
    # OP, --hw H, --dtype D, --json and key=value in any order (argparse cannot mix free positionals
    # with options, so the words are parsed here)
    op.add_argument("words", nargs=argparse.REMAINDER, metavar="OP --hw H [--dtype D] [key=value ...] [--json]",
                    help=f"OP one of {', '.join(OPS)}; --hw hardware name or alias; --dtype weights (gemm, moe, "
                         "mla_decode) or KV cache (attention)")
    op.set_defaults(func=handle)


def parse_words(words: list[str]) -> tuple[str, str, str, bool, list[str]]:
    """(op, hw, dtype, json, key=value words) of the command line after ``tkcc cost op``."""
    from cost_model import CostModelError

    op = hw = None
    dtype, as_json, params = "bf16", False, []
    it = iter(words)
    for w in it:
        flag, eq, val = w.partition("=")
        if flag in ("--hw", "--dtype"):
            val = val if eq else next(it, None)
            if not val:
                raise CostModelError(f"{flag} needs a value")
            hw, dtype = (val, dtype) if flag == "--hw" else (hw, val)
        elif w == "--json":
            as_json = True
        elif w.startswith("-"):
            raise CostModelError(f"unknown option {w!r} (options: --hw, --dtype, --json)")
        elif op is None and not eq:
            op = w
        else:
            params.append(w)
    if op is None:
        raise CostModelError(f"tkcc cost op: name an op, one of {', '.join(OPS)}")
    if hw is None:
        raise CostModelError("tkcc cost op: --hw is required")
    return op, hw, dtype, as_json, params


def parse_shape(op: str, params: list[str]) -> dict:
    """The op's shape from ``key=value`` words: every required key, known keys only, numbers > 0
    (``skew`` and ``window`` >= 0); raises CostModelError with one line otherwise."""
    from cost_model import CostModelError

    if op not in OPS:
        raise CostModelError(f"unknown op {op!r}; one of {', '.join(OPS)}")
    required, optional = OPS[op]
    shape: dict = dict(optional)
    for word in params:
        key, eq, value = word.partition("=")
        if not eq or key not in (*required, *optional):
            raise CostModelError(f"{op}: bad argument {word!r}; keys: {', '.join((*required, *optional))} (key=value)")
        if key == "kv_dtype":
            if value not in ("bf16", "fp8"):
                raise CostModelError(f"{op}: kv_dtype must be bf16 or fp8, got {value!r}")
            shape[key] = value
            continue
        try:
            num = float(value) if key in FLOAT_KEYS else int(value)
        except ValueError:
            raise CostModelError(f"{op}: {key}={value!r} is not {'a number' if key in FLOAT_KEYS else 'an integer'}") \
                from None
        if num != num or num in (float("inf"), float("-inf")) or num < 0 or (num == 0 and key not in ("skew", "window")):
            raise CostModelError(f"{op}: {key} must be {'>= 0' if key in ('skew', 'window') else '> 0'}, got {value}")
        shape[key] = num
    missing = [k for k in required if k not in shape]
    if missing:
        raise CostModelError(f"{op}: missing {', '.join(f'{k}=' for k in missing)}")
    if op in ("mla_decode", "dsa_decode") and not 1 <= shape["heads"] <= 128:
        raise CostModelError(f"{op}: heads (query heads on this GPU) must be 1..128, got {shape['heads']}")
    if op == "moe" and (shape["experts"] % shape["ep"] or shape["topk"] > shape["experts"]):
        raise CostModelError("moe: ep must divide experts and topk must not exceed experts")
    if op in COLLECTIVE and shape["gpus"] < 1:
        raise CostModelError(f"{op}: gpus must be >= 1")
    return shape


def cost_op(op: str, hw_name: str, dtype: str, params: list[str]):
    """The ``cost_model.efficiency.OpLatency`` of one ``tkcc cost op`` call."""
    from cost_model import CostModelError, get_hardware
    from cost_model import collective_latency, op_latency

    shape = parse_shape(op, params)
    hw = get_hardware(hw_name)
    if op in COLLECTIVE:
        return collective_latency(COLLECTIVE[op], hw, int(shape["gpus"]), float(shape["bytes"]))
    if dtype not in DTYPES[op]:
        raise CostModelError(f"{op}: --dtype must be one of {', '.join(DTYPES[op])}, got {dtype!r}")
    kv = shape.pop("kv_dtype", None)
    return op_latency(op, hw, shape, dtype, kv)


def handle(args) -> int:
    op, hw, dtype, as_json, params = parse_words(args.words)
    r = cost_op(op, hw, dtype, params)
    if as_json:
        json.dump(r.to_dict(), sys.stdout)
        sys.stdout.write("\n")
        return 0
    dims = " ".join(f"{k}={v:g}" if isinstance(v, (int, float)) else f"{k}={v}" for k, v in r.shape.items())
    print(f"{r.op} {dims} {r.dtype} on {r.hw}: {r.seconds * 1e3:.4f} ms (roofline {r.roofline_s * 1e3:.4f} ms, "
          f"{r.efficiency:.0%} of it, {r.bound}-bound; {r.note})")
    return 0
