"""MXFP4 (OCP microscaling FP4): the 4-bit experts of gpt-oss checkpoints.

A weight row of K values is stored as K/32 blocks; each block holds 32 e2m1 values in 16 bytes (element 2j in
the low nibble of byte j, element 2j + 1 in the high nibble) and one shared e8m0 scale byte s (the power 2^(s - 127)).
e2m1 codes 0..15 are the values of ``FP4_VALUES`` (bit 3 the sign). Checkpoint layout (HF transformers'
``integrations/mxfp4.py``, ``convert_moe_packed_tensors``, which this decode follows; Apache-2.0):
``*_blocks`` [..., rows, K/32, 16] uint8 and ``*_scales`` [..., rows, K/32] uint8, rows being the output
features of a [rows, K] linear weight.

    w = decode_mxfp4(blocks, scales)            # [..., rows, K] bf16: every value exactly representable
    blocks, scales = encode_mxfp4(w)            # round to nearest (seeded random weights use it)

Storage: 4 bits per value plus 8 bits per 32 values = 4.25 bits (``MXFP4_BITS``); decode costs one table
lookup and one ldexp per value.
"""

from __future__ import annotations

import torch

FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
BLOCK = 32                  # values per shared scale
MXFP4_BITS = 4.25           # storage bits per value, scales included
SCALE_BIAS = 127            # e8m0: 2^(s - 127)


def decode_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """blocks[..., G, 16] uint8, scales[..., G] uint8 -> [..., G * 32] of ``dtype``."""
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != BLOCK // 2:
        raise ValueError(f"MXFP4 blocks {list(blocks.shape)} and scales {list(scales.shape)} do not match "
                         f"([..., G, {BLOCK // 2}] and [..., G])")
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32, device=blocks.device)
    lo, hi = lut[(blocks & 0x0F).long()], lut[(blocks >> 4).long()]                   # [..., G, 16] each
    vals = torch.stack([lo, hi], dim=-1).flatten(-2)                                  # [..., G, 32]
    exp = scales.to(torch.int32) - SCALE_BIAS
    out = torch.ldexp(vals, exp[..., None].to(torch.float32))
    return out.flatten(-2).to(dtype)


def encode_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w[..., K] (K a multiple of 32) -> (blocks[..., K/32, 16] uint8, scales[..., K/32] uint8): per block the
    scale 2^(floor(log2 max|w|) - 2) (the OCP MX rule: the largest magnitude lands in [4, 8) before rounding,
    6.0 being e2m1's largest), each value rounded to the nearest e2m1 (ties to the lower magnitude) and saturated.
    Temporaries: ~3 fp32 copies of w (callers encode large stacks one expert at a time)."""
    k = w.shape[-1]
    if k % BLOCK:
        raise ValueError(f"MXFP4 needs the reduced dim to be a multiple of {BLOCK}, got {k}")
    x = w.float().reshape(*w.shape[:-1], k // BLOCK, BLOCK)
    amax = x.abs().amax(dim=-1)                                                       # [..., G]
    e = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp_min(2.0 ** -126))) - 2, torch.zeros_like(amax))
    e = e.clamp(-SCALE_BIAS, 127)
    scaled = x / torch.exp2(e)[..., None]
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], device=w.device)    # between codes 0..7's magnitudes
    code = torch.bucketize(scaled.abs(), mids, out_int32=True)                          # nearest; a tie: the lower
    code = (code | (((scaled < 0) & (code > 0)).int() << 3)).to(torch.uint8)          # sign bit (no -0 codes)
    pairs = code.reshape(*code.shape[:-1], BLOCK // 2, 2)
    blocks = pairs[..., 0] | (pairs[..., 1] << 4)
    return blocks, (e + SCALE_BIAS).to(torch.uint8)


def mxfp4_bytes(values: int) -> float:
    """Bytes of ``values`` MXFP4 weights, scales included."""
    return values * MXFP4_BITS / 8
