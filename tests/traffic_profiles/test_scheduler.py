"""The one scheduler policy (traffic_profiles/scheduler.py) that the replay and the serving engine run."""

from traffic_profiles.scheduler import Scheduler, SchedulerConfig, Seq, TokenBudget


def _sched(**kw) -> Scheduler:
    cap, hits = kw.pop("cap", None), kw.pop("hits", None)
    return Scheduler(SchedulerConfig(**kw), TokenBudget(cap, hits))


def test_decodes_first_then_chunks_then_admissions_within_the_token_budget():
    s = _sched(max_num_seqs=4, max_num_batched_tokens=10)
    a, b, c = s.submit("a", 12, 3), s.submit("b", 4, 2), s.submit("c", 4, 2)
    p1 = s.schedule()
    assert [(q.rid, n) for q, n in p1.chunks] == [("a", 10)] and not p1.decodes
    s.advance(p1)
    p2 = s.schedule()                                   # a's last 2 prompt tokens, then b and c admitted
    assert [(q.rid, n) for q, n in p2.chunks] == [("a", 2), ("b", 4), ("c", 4)]
    first, done = s.advance(p2)
    assert first == [a, b, c] and not done and a.out_left == 2
    p3 = s.schedule()
    assert p3.decodes == (a, b, c) and p3.num_tokens == 3
    _, done = s.advance(p3)
    assert done == [b, c] and s.running == [a]


def test_kv_reservation_waits_and_rejects_what_never_fits():
    s = _sched(max_num_batched_tokens=100, cap=20)
    s.submit("big", 30, 5)
    s.submit("x", 10, 5)
    s.submit("y", 10, 5)
    p = s.schedule()
    assert [q.rid for q in p.rejected] == ["big"] and [q.rid for q, _ in p.chunks] == ["x"]   # y waits: 15 + 15 > 20
    assert [q.rid for q in s.waiting] == ["y"]
    s.finish(s.running[0])
    assert s.kv.used == 0 and [q.rid for q, _ in s.schedule().chunks] == ["y"]


def test_max_num_seqs_and_prefix_hits():
    s = _sched(max_num_seqs=1, max_num_batched_tokens=100, hits=[8, 0])
    a = s.submit(0, 10, 2)
    s.submit(1, 10, 2)
    p = s.schedule()
    assert a.computed == 8 and [(q.rid, n) for q, n in p.chunks] == [(0, 2)] and len(s.waiting) == 1


def test_pure_decode_stretch_advances_many_steps():
    s = _sched()
    a = s.submit("a", 1, 10)
    s.advance(s.schedule())
    plan = s.schedule()
    _, done = s.advance(plan, decode_steps=9)
    assert done == [a] and a.computed == 10 and not s.has_work()


def test_seq_identity_not_equality():
    s = _sched()
    x, y = Seq("same", 3, 1), Seq("same", 3, 1)
    s.add(x)
    s.add(y)
    s.finish(y)
    assert list(s.waiting) == [x]


def test_the_chunked_prefill_size_caps_each_prompt_chunk():
    s = _sched(max_num_seqs=4, max_num_batched_tokens=10, max_chunk_tokens=4)
    s.submit("a", 9, 2)
    s.submit("b", 3, 2)
    p1 = s.schedule()                                   # a takes 4, b is admitted with what is left
    assert [(q.rid, n) for q, n in p1.chunks] == [("a", 4), ("b", 3)]
    s.advance(p1)
    p2 = s.schedule()
    assert [(q.rid, n) for q, n in p2.chunks] == [("a", 4)] and [q.rid for q in p2.decodes] == ["b"]
