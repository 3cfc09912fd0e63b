"""The judge's op-level check budget follows the memory free on the GPU, not only its size: GLM-5.2's fast and slow
tiers hold ~71 GB of weights on a 150 GB H200, and a quarter of the total let moe_experts' check keep 31 real-size
experts, whose fp32 w13 alone is the 2.9 GiB allocation that ran out of memory there."""

from types import SimpleNamespace

import torch

from persistent_engine.judge import engine as eng
from persistent_engine.ops.moe import _experts_fit

GLM52_EXPERTS = {"T": 3460, "E": 256, "k": 8, "H": 6144, "I": 2048}
H200_TOTAL = 150_100_000_000


def _w13_fp32_bytes(shape: dict) -> int:
    return shape["E"] * 2 * shape["I"] * shape["H"] * 4


def test_a_quarter_of_the_h200_kept_the_experts_whose_w13_ran_out_of_memory():
    fitted = _experts_fit(GLM52_EXPERTS, H200_TOTAL // 4)
    assert fitted["E"] == 31
    assert round(_w13_fp32_bytes(fitted) / 2 ** 30, 1) == 2.9


def test_the_budget_is_at_most_half_the_free_memory(monkeypatch):
    judge = SimpleNamespace(op_check_budget=H200_TOTAL // 4, device=torch.device("cuda"))
    monkeypatch.setattr(eng, "free_gpu_bytes", lambda device: 30 << 30)
    budget = eng.Engine._op_budget(judge)
    assert budget == 15 << 30
    fitted = _experts_fit(GLM52_EXPERTS, budget)
    assert 2 * GLM52_EXPERTS["k"] <= fitted["E"] < 31
    monkeypatch.setattr(eng, "free_gpu_bytes", lambda device: 120 << 30)       # an idle GPU: the quarter
    assert eng.Engine._op_budget(judge) == H200_TOTAL // 4


def test_no_budget_on_cpu():
    assert eng.Engine._op_budget(SimpleNamespace(op_check_budget=None, device=torch.device("cpu"))) is None
