import math

import pytest

from cost_model import CostModelError, get_hardware, known_hardware
from cost_model.hardware import resolve_name


@pytest.mark.parametrize("name,canon", [("h200", "h200"), ("H100", "h100"), ("nvl72", "gb200"),
                                        ("GB300-NVL72", "gb300"), ("mi355", "mi355x"), ("b300", "b300")])
def test_names_and_aliases(name, canon):
    assert resolve_name(name) == canon
    assert get_hardware(name).name == canon


def test_catalogue_figures_from_the_reference_table():
    h200 = get_hardware("h200")
    assert h200.hbm_bytes == 141 * 2 ** 30 and h200.hbm_bw == 4.8e12 and h200.domain == 8
    assert h200.peak_flops("fp8") == 1978e12 and not h200.supports("fp4")
    assert get_hardware("gb200").domain == 72 and get_hardware("b300").peak_flops("fp4") == 14000e12
    assert get_hardware("mi300x").hbm_bytes == 192e9
    assert set(known_hardware()) >= {"h100", "h200", "b200", "b300", "gb200", "gb300", "mi300x", "mi355x", "cpu"}


def test_unknown_hardware_is_a_user_error():
    with pytest.raises(CostModelError) as e:
        get_hardware("h999")
    assert e.value.user_error and "h999" in str(e.value) and "h200" in str(e.value)


def test_cpu_is_measured():
    cpu = get_hardware("cpu")
    assert cpu.measured and cpu.name == "cpu"
    assert 1e9 < cpu.hbm_bw < 1e13 and math.isfinite(cpu.hbm_bw)
    assert 1e9 < cpu.peak_flops("bf16") < 1e14
    assert cpu.hbm_bytes > 1e9
