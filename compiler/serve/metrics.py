"""Prometheus metrics of ``tkcc serve`` (text exposition format, written by hand: no client library).

Histograms: ``tkcc:time_to_first_token_seconds``, ``tkcc:inter_token_latency_seconds``,
``tkcc:e2e_request_latency_seconds``, ``tkcc:step_seconds``; gauges: ``tkcc:num_requests_waiting``,
``tkcc:num_requests_running``, ``tkcc:kv_cache_usage_ratio``, ``tkcc:generation_tokens_per_second``
(over the last 10 s); counters: ``tkcc:generation_tokens_total``, ``tkcc:request_success_total``,
``tkcc:prefix_cache_hit_tokens_total``, ``tkcc:prompt_tokens_total``, and of chat requests with tools
``tkcc:tool_answers_total`` (answers), ``tkcc:tool_calls_parsed_total`` (calls parsed out of them),
``tkcc:tool_answers_unparsed_total`` (answers with no call: returned as text).
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
WINDOW_S = 10.0


class _Histogram:
    def __init__(self):
        self.counts, self.sum, self.n = [0] * (len(BUCKETS) + 1), 0.0, 0

    def observe(self, v: float) -> None:
        self.counts[bisect.bisect_left(BUCKETS, v)] += 1
        self.sum += v
        self.n += 1

    def lines(self, name: str) -> list[str]:
        out, acc = [f"# TYPE {name} histogram"], 0
        for b, c in zip(BUCKETS, self.counts):
            acc += c
            out.append(f'{name}_bucket{{le="{b}"}} {acc}')
        out += [f'{name}_bucket{{le="+Inf"}} {self.n}', f"{name}_sum {self.sum}", f"{name}_count {self.n}"]
        return out


class Metrics:
    """Thread-safe: the event loop records tokens, the engine thread records steps."""

    def __init__(self):
        self.lock = threading.Lock()
        self.ttft, self.itl, self.e2e, self.steps = _Histogram(), _Histogram(), _Histogram(), _Histogram()
        self.tokens_total, self.finished, self.started = 0, 0, 0
        self.tool_answers, self.tool_calls, self.tool_unparsed = 0, 0, 0
        self.recent: deque[float] = deque()            # times of recent tokens

    def request_started(self) -> None:
        with self.lock:
            self.started += 1

    def request_finished(self, seconds: float) -> None:
        with self.lock:
            self.finished += 1
            self.e2e.observe(seconds)

    def tool_answer(self, calls: int) -> None:
        with self.lock:
            self.tool_answers += 1
            self.tool_calls += calls
            self.tool_unparsed += calls == 0

    def token(self, gap_s: float, first: bool) -> None:
        now = time.monotonic()
        with self.lock:
            (self.ttft if first else self.itl).observe(gap_s)
            self.tokens_total += 1
            self.recent.append(now)
            while self.recent and self.recent[0] < now - WINDOW_S:
                self.recent.popleft()

    def step(self, seconds: float, stats: dict) -> None:
        with self.lock:
            self.steps.observe(seconds)

    def tokens_per_s(self) -> float:
        now = time.monotonic()
        with self.lock:
            while self.recent and self.recent[0] < now - WINDOW_S:
                self.recent.popleft()
            return len(self.recent) / WINDOW_S

    def render(self, stats: dict) -> str:
        tps = self.tokens_per_s()
        with self.lock:
            lines = []
            for name, value, kind in (
                    ("tkcc:num_requests_waiting", stats["waiting"], "gauge"),
                    ("tkcc:num_requests_running", stats["running"], "gauge"),
                    ("tkcc:kv_cache_usage_ratio", stats["kv_usage"], "gauge"),
                    ("tkcc:generation_tokens_per_second", tps, "gauge"),
                    ("tkcc:generation_tokens_total", self.tokens_total, "counter"),
                    ("tkcc:request_success_total", self.finished, "counter"),
                    ("tkcc:prompt_tokens_total", stats["prompt_tokens"], "counter"),
                    ("tkcc:prefix_cache_hit_tokens_total", stats["prefix_hit_tokens"], "counter"),
                    ("tkcc:tool_answers_total", self.tool_answers, "counter"),
                    ("tkcc:tool_calls_parsed_total", self.tool_calls, "counter"),
                    ("tkcc:tool_answers_unparsed_total", self.tool_unparsed, "counter")):
                lines += [f"# TYPE {name} {kind}", f"{name} {value}"]
            for name, h in (("tkcc:time_to_first_token_seconds", self.ttft),
                            ("tkcc:inter_token_latency_seconds", self.itl),
                            ("tkcc:e2e_request_latency_seconds", self.e2e), ("tkcc:step_seconds", self.steps)):
                lines += h.lines(name)
        return "\n".join(lines) + "\n"
