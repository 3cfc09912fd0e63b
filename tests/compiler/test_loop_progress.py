"""The progress view: counters from many threads, the status line, the board mirror."""

import io
import threading
import time

from compiler.search.progress import Progress


def test_counts_from_threads_and_line():
    seen = []
    p = Progress(time.monotonic() + 100, stream=io.StringIO(), on_change=seen.append)
    p.restarts_from(lambda: 2)

    def work():
        for _ in range(100):
            p.count("tried")
    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    p.accepted(1.25)
    p.accepted(1.5)
    p.phase("searching")
    snap = p.snapshot()
    assert (snap.tried, snap.accepted, snap.best_speedup, snap.restarts, snap.phase) == (400, 2, 1.5, 2, "searching")
    assert "tried 400" in snap.line() and "best  1.500x" in snap.line() and "restarts 2" in snap.line()
    assert len(seen) == 403 and seen[-1].phase == "searching"
    assert 95 < snap.time_left_s <= 100


def test_events_and_periodic_lines_on_a_non_tty():
    out = io.StringIO()
    p = Progress(time.monotonic() + 10, stream=out, every_s=0.05).start()
    p.event("accepted x")
    time.sleep(0.3)
    final = p.close()
    text = out.getvalue()
    assert "[tkcc] accepted x" in text and text.count("[tkcc] starting") >= 3
    assert "\r" not in text and final.phase == "starting"


def test_quiet_prints_nothing_and_a_failing_mirror_is_ignored():
    out = io.StringIO()

    def broken(_):
        raise RuntimeError("board down")
    p = Progress(time.monotonic() + 10, stream=out, quiet=True, on_change=broken).start()
    p.count("tried")
    p.event("x")
    p.close()
    assert out.getvalue() == "" and p.snapshot().tried == 1


def test_dropped_summary_groups_by_reason_most_frequent_first():
    from compiler.search.tally import dropped_summary
    dropped = [(f"k-{i}", "overrides an op of a faster accepted candidate") for i in range(250)]
    dropped += [("rot-1", "shadowed by a composite override: never called when composed")]
    line = dropped_summary(dropped)
    assert line.startswith("; dropped 250: overrides an op of a faster accepted candidate (k-0, k-1, k-2, +247 more)")
    assert line.endswith("; dropped 1: shadowed by a composite override: never called when composed (rot-1)")
    assert len(line) < 300 and dropped_summary([]) == ""
