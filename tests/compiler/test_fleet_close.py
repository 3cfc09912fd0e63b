"""An evaluation that the end of the run cuts (an overrunning agent's, while the fleet closes) is no verdict."""

from __future__ import annotations

import threading

import zmq

from compiler.fleet.local import TierEngine


class _Supervisor:
    """Stands in for the engine process: ``evaluate`` blocks until ``close`` closes its socket, then
    fails the way a ZMQ client does on a closed socket."""

    def __init__(self):
        self.closed = threading.Event()
        self.auto_restart = True

    def evaluate(self, source, timeout_s, name="candidate", samples=None, queued=()):
        self.closed.wait(10)
        raise zmq.ZMQError(zmq.ENOTSOCK)

    def close(self):
        self.closed.set()


def test_an_evaluation_cut_by_close_is_not_evaluated_not_rejected():
    sup = _Supervisor()
    engine = TierEngine(placement=type("P", (), {"tier": "fast", "device": "cpu"})(), supervisor=sup,
                    measure_lock=threading.Lock())
    got = []
    t = threading.Thread(target=lambda: got.append(engine.evaluate("OVERRIDES = {}", 30.0)))
    t.start()
    engine.close()
    t.join(10)
    assert got and got[0].reasons[0].startswith("not evaluated: the run's budget is spent")
    assert engine.failures == 0


def test_an_engine_error_while_running_is_still_reported():
    class Failing(_Supervisor):
        def evaluate(self, *a, **k):
            raise zmq.ZMQError(zmq.ENOTSOCK)
    engine = TierEngine(placement=type("P", (), {"tier": "fast", "device": "cpu"})(), supervisor=Failing(),
                    measure_lock=threading.Lock())
    v = engine.evaluate("OVERRIDES = {}", 30.0)
    assert v.reasons[0].startswith("engine error: ZMQError") and engine.failures == 1
