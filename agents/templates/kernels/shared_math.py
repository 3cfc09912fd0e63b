"""Elementwise functions several templates' kernels use, written once.

Not a template of its own: ``triton_glu_and_mul`` and ``triton_moe_experts`` import it in their header, and
``render_candidate`` inlines the functions a candidate's templates use once, after their sections.
"""

import triton
import triton.language as tl

# ---- section ----
@triton.jit
def _sm_tanh(x):
    """tanh(x) in fp32 from one exp of -2|x| (never overflows)."""
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)
