"""Static checks and loading of candidate sources (DESIGN.md step 1), in this process."""

import inspect
import pathlib
import sys

import pytest

from persistent_engine import candidate as cm
from persistent_engine.ops import registry

HERE = pathlib.Path(__file__).parent / "candidates"
OP_PARAMS = {n: cm.param_names(inspect.signature(registry.get(n).reference)) for n in registry.names()}


def src(name: str) -> str:
    return (HERE / name).read_text()


@pytest.mark.parametrize("name", ["good_torch.py", "good_triton.py", "cached_outputs.py", "leaks_thread.py",
                                  "abort_sneaky.py", "hang.py", "patches_timer.py", "timed_differs.py"])
def test_static_check_passes_policy_conforming_sources(name):
    assert cm.static_check(src(name), OP_PARAMS) == []


def test_a_config_only_candidate_passes_the_static_check():
    assert cm.static_check('OVERRIDES = {}\nCONFIG = {"max_num_seqs": 64}\n', OP_PARAMS) == []
    assert "static: OVERRIDES is empty" in cm.static_check("OVERRIDES = {}\nCONFIG = {}\n", OP_PARAMS)


@pytest.mark.parametrize("source, needle", [
    ("", "empty source"),
    ("def f(:\n", "does not parse: line 1"),
    ("x = 1\n", "no top-level OVERRIDES"),
    ("OVERRIDES = {}\n", "OVERRIDES is empty"),
    ("import os\nOVERRIDES = {}\n", "forbidden import 'os'"),
    ("import subprocess as sp\n", "forbidden import 'subprocess'"),
    ("from ctypes import CDLL\n", "forbidden import 'ctypes'"),
    ("import importlib.util\n", "forbidden import 'importlib.util'"),
    ("from socket import socket\n", "forbidden import 'socket'"),
    ("from . import x\n", "relative import"),
    ("m = __import__('o' + 's')\n", "forbidden name '__import__'"),
    ("exec('import os')\n", "forbidden name 'exec'"),
    ("eval('1')\n", "forbidden name 'eval'"),
    ("f = open('/etc/passwd')\n", "forbidden name 'open'"),
    ("x = (1).__class__.__bases__[0].__subclasses__()\n", "forbidden attribute '__subclasses__'"),
    ("def f(): pass\ng = f.__globals__\n", "forbidden attribute '__globals__'"),
    ("import torch\ntorch.os.abort()\n", "forbidden attribute 'os'"),
    ("import torch\nm = torch.sys.modules\n", "forbidden attribute 'sys'"),
])
def test_static_check_refuses(source, needle):
    reasons = cm.static_check(source, OP_PARAMS)
    assert any(needle in r for r in reasons), reasons
    assert all(r.startswith("static: ") for r in reasons)


def test_unknown_op_and_wrong_signature_are_refused_statically():
    (r1,) = cm.static_check(src("unknown_op.py"), OP_PARAMS)
    assert "unknown op 'rms_normalize'" in r1
    (r2,) = cm.static_check(src("wrong_signature.py"), OP_PARAMS)
    assert "signature of rms_norm override (x, weight)" in r2 and "(x, weight, eps)" in r2
    (r3,) = cm.static_check(src("abort_import_os.py"), OP_PARAMS)
    assert "forbidden import 'os'" in r3


def test_load_builds_a_fresh_module_each_time(tmp_path):
    a = cm.load_candidate(src("good_torch.py"), "a", str(tmp_path), OP_PARAMS)
    b = cm.load_candidate(src("good_torch.py"), "b", str(tmp_path), OP_PARAMS)
    assert isinstance(a, cm.LoadedCandidate) and isinstance(b, cm.LoadedCandidate)
    assert a.module is not b.module and a.overrides["fused_add_rms_norm"] is not b.overrides["fused_add_rms_norm"]
    assert a.config == {"cuda_graph": True} and a.description.startswith("fused_add_rms_norm")
    assert a.module.__name__ in sys.modules
    cm.unload_candidate(a)
    cm.unload_candidate(b)
    assert a.module.__name__ not in sys.modules and not pathlib.Path(a.path).exists()


@pytest.mark.parametrize("source, needle", [
    ("raise SystemExit(3)\n", "import raised SystemExit"),
    ("1 / 0\n", "import raised ZeroDivisionError"),
    ("OVERRIDES = dict(rms_norm=lambda x, w: x)\n", "signature of rms_norm override (x, w)"),
    ("import functools\ndef f(*a):\n    return a\nOVERRIDES = {'rms_norm': functools.partial(f)}\n",
     "signature of rms_norm override (*a)"),
    ("OVERRIDES = {'nope': print}\n", "unknown op 'nope'"),
    ("OVERRIDES = {'rms_norm': 3}\n", "is not callable"),
    ("OVERRIDES = [1]\n", "OVERRIDES must be a non-empty dict"),
    ("def rms_norm(x, weight, eps):\n    return x\nOVERRIDES = {'rms_norm': rms_norm}\nCONFIG = {'warp_speed': 9}\n",
     "unknown CONFIG key 'warp_speed'"),
    ("def rms_norm(x, weight, eps):\n    return x\nOVERRIDES = {'rms_norm': rms_norm}\nCONFIG = {'max_num_seqs': '8'}\n",
     "CONFIG['max_num_seqs'] has the wrong type"),
    ("def rms_norm(x, weight, eps):\n    return x\nOVERRIDES = {'rms_norm': rms_norm}\nDESCRIPTION = 5\n",
     "DESCRIPTION must be a string"),
])
def test_load_reports_what_is_wrong_with_the_live_module(tmp_path, source, needle):
    reasons = cm.load_candidate(source, "c", str(tmp_path), OP_PARAMS)
    assert isinstance(reasons, list) and any(needle in r for r in reasons), reasons
