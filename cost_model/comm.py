"""Collective communication times (alpha-beta model), inside the scale-up domain or across it.

    alpha  fixed cost of one collective / message (hw.message_latency_s, ~10 us)
    hop    per ring step (hw.hop_latency_s inside the domain, 5x that across domains)
    beta   per-GPU one-direction bandwidth: hw.scale_up_bw inside the domain, hw.scale_out_bw
           across it

A group of n consecutive ranks stays inside the domain when n <= hw.domain. A ring that leaves
the domain runs at the scale-out bandwidth; an all-to-all splits its traffic: the share that goes
to peers outside the GPU's domain, (n - d) / (n - 1), runs at scale-out bandwidth, the rest at
scale-up bandwidth, both at once.

    all_reduce(n, S)   S bytes per GPU; min(ring 2(n-1)/n S/beta + 2(n-1) hop, one-shot (n-1) S/beta)
    all_gather(n, S)   S bytes gathered in total; (n-1)/n S/beta + (n-1) hop
    all_to_all(n, S)   S bytes the busiest GPU sends (or receives) to remote peers
    p2p(S)             one message of S bytes between neighbouring pipeline stages
"""

from __future__ import annotations

from cost_model.hardware import Hardware

COLLECTIVES = ("all_reduce", "all_gather", "all_to_all", "p2p")


def _links(hw: Hardware, n: int) -> tuple[float, float, bool]:
    """(bandwidth, hop latency, crosses the domain) for a ring over n consecutive ranks."""
    if n <= hw.domain:
        return hw.scale_up_bw, hw.hop_latency_s, False
    return hw.scale_out_bw, 5 * hw.hop_latency_s, True


def all_reduce_time(hw: Hardware, n: int, nbytes: float) -> float:
    if n <= 1:
        return 0.0
    bw, hop, _ = _links(hw, n)
    ring = 2 * (n - 1) / n * nbytes / bw + 2 * (n - 1) * hop
    one_shot = (n - 1) * nbytes / bw + hop
    return hw.message_latency_s + min(ring, one_shot)


def all_gather_time(hw: Hardware, n: int, nbytes: float) -> float:
    if n <= 1:
        return 0.0
    bw, hop, _ = _links(hw, n)
    return hw.message_latency_s + (n - 1) / n * nbytes / bw + (n - 1) * hop


def all_to_all_time(hw: Hardware, n: int, nbytes: float) -> float:
    if n <= 1:
        return 0.0
    if n <= hw.domain:
        return hw.message_latency_s + nbytes / hw.scale_up_bw + hw.hop_latency_s
    outside = (n - hw.domain) / (n - 1)
    return hw.message_latency_s + 5 * hw.hop_latency_s + max(
        nbytes * (1 - outside) / hw.scale_up_bw, nbytes * outside / hw.scale_out_bw)


def p2p_time(hw: Hardware, nbytes: float, crosses: bool) -> float:
    bw = hw.scale_out_bw if crosses else hw.scale_up_bw
    return hw.message_latency_s + nbytes / bw


def collective_time(hw: Hardware, collective: str, n: int, nbytes: float, instance_gpus: int = 1) -> float:
    """Seconds for one collective; ``instance_gpus`` decides whether pipeline p2p leaves the domain."""
    if collective == "all_reduce":
        return all_reduce_time(hw, n, nbytes)
    if collective == "all_gather":
        return all_gather_time(hw, n, nbytes)
    if collective == "all_to_all":
        return all_to_all_time(hw, n, nbytes)
    if collective == "p2p":
        return p2p_time(hw, nbytes, instance_gpus > hw.domain)
    raise ValueError(f"unknown collective {collective!r}")
