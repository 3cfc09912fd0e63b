"""Hand-computed bytes and kernel counts of the engine's reference ops (cost_model.ops_reference)."""
import importlib.util
from pathlib import Path

import pytest

from cost_model import Layout, step_ops
from cost_model.ops_reference import (K_TRANSPOSE_READ, ref_attention_decode, ref_attention_prefill,
                                      ref_moe_experts, ref_rms_norm, ref_rotary)
from persistent_engine.models.spec import ModelSpec
from traffic_profiles import TrafficPoint

ROOT = Path(__file__).resolve().parents[2]


def test_norm_chains_by_hand():
    # rms_norm: to 6, pow 8, mean 4, mul 8, mul 8, to 6 = 40 B/elem, 9 torch ops
    n = ref_rms_norm("n", 10 * 64, fused_add=False)
    assert (n.bytes, n.kernels) == (40 * 640, 9)
    # fused_add: two casts 12, add 12, the rest of the norm 34, residual cast 6 = 64 B/elem, 12 ops
    f = ref_rms_norm("f", 10 * 64, fused_add=True)
    assert (f.bytes, f.kernels) == (64 * 640, 12)


def test_rotary_by_hand():
    # T 3, q and k 6 heads of 16 dims all rotated: 48 B per element + cos/sin gather 3 x 16 x 4 x 2
    r = ref_rotary(3, 6, 16, 16)
    assert r.bytes == 3 * 6 * 16 * 48 + 3 * 16 * 8 and r.kernels == 19


def test_attention_decode_by_hand():
    # S 2, context 20 (+1 new) -> Lp 32 (2 blocks of 16); Hq 4, Hk 2, D 8, bf16
    a = ref_attention_decode(2, 20, 4, 2, 8, 8, 2.0, "bf16")
    k = v = 2 * 32 * 2 * 8 * 2                          # 2048 B each
    scores = 2 * 4 * 32
    moves = 3 * (k + v) + (K_TRANSPOSE_READ + 1) * k + 2 * v    # gather r+w, bmm read; copies for S, Hk > 1
    assert a.bytes == moves + 52 * scores + 2 * 32 * 9 + 2 * 4 * 16 * 2
    assert a.kernels == 16 and a.flops == 2 * scores * 16
    # one sequence: the bmm reads the gathered K and V in place, no copies
    b = ref_attention_decode(1, 20, 4, 2, 8, 8, 2.0, "bf16")
    assert b.bytes == 3 * 2048 + 52 * 128 + 32 * 9 + 4 * 16 * 2 == 13216
    assert b.kernels == 14


def test_attention_prefill_by_hand():
    # one sequence, 8 new tokens, no context: Lp 16, one query chunk; every query scores all 16 keys
    a = ref_attention_prefill(1, 8, 0, 4, 2, 8, 8, 2.0)
    kv_elems = 16 * 2 * 16
    scores = 8 * 4 * 16
    q_out = 8 * 4 * (6 * 8 + 8 * 8 + 24 * 8) + 2 * 8 * 4 * 8
    assert a.bytes == kv_elems * (2 + 2 + 2 + 4 + 4) + 44 * scores + q_out + 8 * 16 * 3 == 40320
    assert a.kernels == 17 + 6 + 15 and a.dtype == "fp32"
    # two sequences: each scores all T queries (masked), twice the exact work
    two = ref_attention_prefill(2, 8, 0, 4, 2, 8, 8, 2.0)
    assert two.flops == 4 * a.flops


def test_moe_experts_paths_by_hand():
    s = ModelSpec.from_name("qwen3-moe")                 # E 128, k 8, H 2048, I 768
    w = 3 * 2048 * 768 * 2                               # one expert's w13 + w2, bf16
    g = ref_moe_experts(s, Layout(), 1, 0.0)             # 3 T k = 24 < 128: gather
    assert g.name == "moe_experts_gather" and g.kernels == 13
    assert g.bytes == 3 * 8 * w + 8 * (20 * 2048 + 44 * 768) + 2048 * 10
    d = ref_moe_experts(s, Layout(), 8, 0.0)             # below 512 tokens: every expert densely
    assert d.name == "moe_experts_dense" and d.kernels == 12
    assert d.bytes == 128 * w + 128 * 8 * (12 * 2048 + 44 * 768) + 8 * (2048 * 10 + 128 * 8)
    lp = ref_moe_experts(s, Layout(), 512, 0.0)          # loop over used experts: ~13 kernels each
    assert lp.name == "moe_experts_loop" and lp.kernels == 6 + 13 * 128


def test_reference_step_follows_the_decoder():
    s = ModelSpec.from_name("llama-1b")                  # 16 dense GQA layers
    ops = step_ops(s, Layout(), TrafficPoint(phase="decode", batch=4, context=100), impl="reference")
    names = [o.name for o in ops]
    assert "qkv_split" not in names and "rms_norm" not in names          # strided views; zero residual
    assert names.count("residual_zeros") == 1 and names[-1] == "logits_fp32"
    norms = [o for o in ops if o.name == "fused_add_rms_norm"]
    assert sum(o.count for o in norms) == 2 * 16
    assert next(o for o in ops if o.name == "final_norm").bytes == 64 * 4 * 2048
    pre = step_ops(s, Layout(), TrafficPoint(phase="prefill", batch=1, context=0, chunk=64), impl="reference")
    assert "last_tokens" in [o.name for o in pre]


def _bench():
    spec = importlib.util.spec_from_file_location("cost_model_accuracy", ROOT / "benchmarks" / "cost_model_accuracy.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_held_out_split_is_stratified():
    b = _bench()
    rows = ([{"model": "a", "point": {"phase": "decode"}}] * 3 + [{"model": "a", "point": {"phase": "prefill"}}] * 2
            + [{"model": "b", "point": {"phase": "decode"}}] * 2)
    assert b.split_sets(rows) == ["train", "held_out", "train", "train", "held_out", "train", "held_out"]
    sets = b.split_sets([r for m, _, pts in b.GPU_SUITE for r in ({"model": m, "point": p.to_dict()} for p in pts)])
    assert len(sets) >= 20 and sets.count("held_out") >= 10


def test_unknown_model_is_a_one_line_error(capsys, tmp_path):
    assert _bench().main(["--device", "cpu", "--models", "nope", "--out-dir", str(tmp_path)]) == 2
    assert "nope" in capsys.readouterr().err and not list(tmp_path.iterdir())


def test_engine_constants_in_step():
    """ops_reference copies three engine constants (cost_model may import only models.spec); they must
    stay what the engine runs."""
    from cost_model import ops_reference as ref
    from persistent_engine.ops import attention, moe, opdef

    assert ref.REF_BLOCK_SIZE == opdef.DEFAULT_BLOCK_SIZE
    assert ref.REF_MOE_LOOP_MIN_TOKENS == moe.LOOP_MIN_TOKENS
    assert ref.REF_PREFILL_SCORE_BUDGET == attention.PREFILL_SCORE_BUDGET
