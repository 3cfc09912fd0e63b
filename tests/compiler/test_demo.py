"""``make demo``'s command line on CPU and GPU machines (the demo itself is run by ``make demo``)."""

from pathlib import Path

from compiler.demo import TRAFFIC, demo_args


def test_cpu_demo_uses_tiny_model_and_bundled_traffic(monkeypatch):
    monkeypatch.delenv("TKCC_DEMO_BUDGET", raising=False)
    args = demo_args(False)
    opts = dict(zip(args[1::2], args[2::2]))
    assert args[0] == "optimize" and opts["--model"] == "tiny-dense" and opts["--device"] == "cpu"
    assert opts["--budget"] == "3m" and Path(opts["--traffic"]) == TRAFFIC and TRAFFIC.is_file()


def test_gpu_demo_targets_the_detected_gpu(monkeypatch):
    monkeypatch.setenv("TKCC_DEMO_BUDGET", "20m")
    opts = dict(zip(*[iter(demo_args(True, "NVIDIA H100 80GB HBM3")[1:])] * 2))
    assert (opts["--model"], opts["--hw"], opts["--budget"]) == ("llama-1b", "h100", "20m")
    assert dict(zip(*[iter(demo_args(True, "Some GPU")[1:])] * 2))["--hw"] == "h200"
