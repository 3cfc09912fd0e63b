from persistent_engine.measure import timing


def test_long_gpu_steps_get_fewer_samples_but_never_too_few():
    cap = timing.DEFAULT_SAMPLES["cuda"]
    assert timing.samples_for("cuda", 0.3, cap) == cap            # a graphed decode step keeps all
    assert timing.samples_for("cuda", 4.0, cap) == timing.MIN_SAMPLES   # an eager prefill is cut
    assert timing.MIN_SAMPLES < timing.samples_for("cuda", 1.0, cap) < cap
    assert timing.samples_for("cuda", 1e3, cap) == timing.MIN_SAMPLES


def test_cpu_samples_of_chained_decode_steps_keep_every_sample_a_long_prefill_fewer():
    cap = timing.DEFAULT_SAMPLES["cpu"]
    assert timing.samples_for("cpu", 5.0, cap) == cap             # a 5 ms sample of k decode steps
    assert timing.samples_for("cpu", 500.0, cap) == timing.MIN_SAMPLES   # a long CPU prefill step


def test_minor_points_get_fewer_samples():
    cap = timing.DEFAULT_SAMPLES["cpu"]
    assert timing.samples_for("cpu", 300.0, cap, weight_share=0.005) == timing.MINOR_MIN_SAMPLES
    assert timing.samples_for("cpu", 300.0, cap, weight_share=1.0) == timing.MIN_SAMPLES
    assert timing.samples_for("cuda", 0.3, 50, weight_share=0.5) == 50        # a major point keeps all
    assert timing.MINOR_MIN_SAMPLES < timing.samples_for("cuda", 0.3, 50, weight_share=0.02) < 50
