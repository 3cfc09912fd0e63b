"""Queueing delay before a request's prefill starts: G/G/c under the trace's arrival process.

Requests arrive at ``rate`` per second with inter-arrival coefficient of variation ``ca`` (1 for
Poisson; ``traffic profile``'s ``interarrival_cv``; bursty traces have more) and are prefilled by
``servers`` parallel servers (DP-attention groups of an instance, or prefill instances), each taking
a service time S whose mean and coefficient of variation ``cs`` follow from the input-length
distribution (a long prompt takes longer, attention quadratically). Utilisation
rho = rate E[S] / c. The mean wait is the Allen-Cunneen approximation with Sakasegawa's
probability of waiting,

    W_q ~= (ca^2 + cs^2) / 2 * rho^(sqrt(2 (c + 1)) - 1) / (c (1 - rho)) * E[S]

which for c = 1 is Kingman's formula, exact for M/M/1 and M/G/1 (Pollaczek-Khinchine). rho >= 1:
the queue grows without bound (``math.inf``). TTFT = W_q + the request's own prefill latency.
"""

from __future__ import annotations

import math

__all__ = ["service_moments", "utilisation", "wait_s"]


def service_moments(times: list[float], weights: list[float]) -> tuple[float, float]:
    """(mean, coefficient of variation) of service times ``times`` with probabilities ``weights``."""
    w = sum(weights)
    if w <= 0 or not times:
        return 0.0, 0.0
    mean = sum(t * p for t, p in zip(times, weights)) / w
    var = sum((t - mean) ** 2 * p for t, p in zip(times, weights)) / w
    return mean, (math.sqrt(var) / mean if mean > 0 else 0.0)


def utilisation(rate: float, mean_s: float, servers: int = 1) -> float:
    return rate * mean_s / max(servers, 1)


def wait_s(rate: float, mean_s: float, ca: float = 1.0, cs: float = 0.0, servers: int = 1) -> float:
    """Mean seconds a request waits for one of ``servers`` servers (``math.inf`` when rho >= 1)."""
    if rate <= 0 or mean_s <= 0:
        return 0.0
    c = max(int(servers), 1)
    rho = utilisation(rate, mean_s, c)
    if rho >= 1.0:
        return math.inf
    p_wait = rho ** (math.sqrt(2.0 * (c + 1)) - 1.0)
    return (ca * ca + cs * cs) / 2.0 * p_wait / (c * (1.0 - rho)) * mean_s
