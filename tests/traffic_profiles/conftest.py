from pathlib import Path

import pytest

from traffic_profiles import read_trace

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "traffic"


@pytest.fixture(scope="session")
def examples():
    return EXAMPLES


@pytest.fixture(scope="session")
def code_trace():
    return read_trace(EXAMPLES / "azure2023_code.csv")


@pytest.fixture(scope="session")
def conv_trace():
    return read_trace(EXAMPLES / "azure2023_conv.csv")
