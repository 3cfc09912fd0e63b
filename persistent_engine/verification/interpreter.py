"""Triton's interpreter on CPU: which candidates run in it, and the one failure it causes that is no verdict.

On CPU, executors run Triton kernels interpreted (``TRITON_INTERPRET=1``, ``executor/launch.executor_env``):
orders of magnitude slower than compiled (such candidates are verified, not timed: ``supervisor``), and with
16-bit numerics unlike a GPU's. The interpreter computes through numpy, which has no bfloat16: measured with
triton 3.9.0, a kernel that adds two bf16 loads (``x + r`` in the inputs' dtype, as GPU kernels do) stores values
near 1e37 and NaN where a GPU stores the sum (issue 46; ``tests/persistent_engine/candidates/triton_native_add.py``).

What the judge excuses (``op_level(interpreted=True)``, ``layer_level``): only where the candidate's source (the
judge's own copy, never the executor's word) defines a Triton kernel and the device is CPU, only NaN/inf in a
16-bit case whose reference is finite, and only when every fp32 case of the same op, shapes and seeds passed
(``verify.op_dtypes`` always checks fp32 too, at the model's shapes). The layer-level check runs the bf16 slice,
where the same arithmetic gives NaN or finite garbage: for such a candidate its logits (NaN/inf, or off the
reference) are not compared, said in the verdict; its other layer-level checks (KV rows written, ops called)
still decide. A kernel wrong in fp32, or NaN in fp32, stays rejected; on a GPU nothing is excused. Stdlib only
(the supervisor imports it).
"""

from __future__ import annotations

import re

# a Triton kernel defined in the source (importing triton alone runs nothing: rendered templates all import it)
_TRITON = re.compile(r"^\s*@\s*triton\s*\.\s*(jit|autotune|heuristics)\b|\btriton\s*\.\s*jit\s*\(", re.MULTILINE)
LOW_PRECISION = ("bf16", "fp16")        # contract._DTYPE_NAMES of the 16-bit float dtypes
NOTE = ("{dtypes} checked in fp32: NaN/inf in Triton's interpreter where the reference is finite, and fp32 at the "
        "same shapes and seeds passed (the interpreter's bf16 is not the GPU's)")
LAYER_NOTE = ("layer-level: the bf16 slice's logits under Triton's interpreter not compared ({n} variant(s) NaN/inf "
              "or off the reference): its ops passed in fp32 at the model's shapes (the interpreter's bf16 is not "
              "the GPU's)")
# compare_logits' reasons of values (not of a step's type, shape, dtype or device)
_LOGIT_VALUES = (": logits contain NaN or inf", ": logits differ from the reference (")


def logits_values_reason(reason: str) -> bool:
    return reason.endswith(_LOGIT_VALUES[0]) or _LOGIT_VALUES[1] in reason


def defines_triton_kernel(source: str) -> bool:
    return bool(_TRITON.search(source))


def runs_interpreted(source: str, device: str) -> bool:
    """Whether ``source``'s kernels run in Triton's interpreter on ``device`` ("cpu", "cuda:0", ...)."""
    return not str(device).startswith("cuda") and defines_triton_kernel(source)


def low_precision_nonfinite(name: str, reason: str) -> str:
    """The dtype ("bf16", "fp16") when ``reason`` (an op-level reason of op ``name``: ``"op-level: <name>
    <dtype> <shape>: <category>: ..."``) is NaN/inf in a 16-bit case; "" otherwise."""
    for dt in LOW_PRECISION:
        if reason.startswith(f"op-level: {name} {dt} ") and ": non-finite: " in reason:
            return dt
    return ""


def op_note(name: str, excused: list[str]) -> str:
    """The passed check's detail of an op whose only failures were ``excused`` (16-bit NaN/inf)."""
    dtypes = sorted({low_precision_nonfinite(name, r) for r in excused})
    return f"op-level: {name}: " + NOTE.format(dtypes="/".join(dtypes)) + f" ({len(excused)} case(s))"
