"""The scale-and-store steps of the row-blocked RMSNorm templates, written once.

Not a template of its own: ``triton_rms_norm`` and ``triton_fused_add_rms_norm`` import it in their header, and
``render_candidate`` inlines the functions a candidate's templates use once, after their sections.
"""

import triton
import triton.language as tl

# ---- section ----
@triton.jit
def _sn_store(xf, rstd, w_ptr, out_ptr, rows, stride_om, c, mask, D):
    """out[rows, c] = xf * rstd * w[c], rounded to out's dtype (xf: the [ROWS, BLOCK_D] fp32 block; rstd [ROWS])."""
    w = tl.load(w_ptr + c, mask=c < D, other=0.0).to(tl.float32)
    y = xf * rstd[:, None] * w[None, :]
    tl.store(out_ptr + rows[:, None] * stride_om + c[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _sn_scale_rows(src_ptr, stride_sm, w_ptr, out_ptr, stride_om, rows, rmask, cols, D, rstd,
                   BLOCK_D: tl.constexpr):
    """The second pass of rows longer than BLOCK_D: out = src * rstd * w, BLOCK_D columns at a time (src read again,
    from L2 for the rows of one program)."""
    for d0 in range(0, D, BLOCK_D):
        c = d0 + cols
        mask = rmask[:, None] & (c[None, :] < D)
        xf = tl.load(src_ptr + rows[:, None] * stride_sm + c[None, :], mask=mask, other=0.0).to(tl.float32)
        _sn_store(xf, rstd, w_ptr, out_ptr, rows, stride_om, c, mask, D)
