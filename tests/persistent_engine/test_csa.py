"""DeepSeek-V4 compressed attention and its indexer against per-token loops over explicit key lists."""

import pytest
import torch

from persistent_engine.ops import registry
from persistent_engine.ops.csa import compressed_attention, csa_indexer


def _inputs(name, shape, seed=0):
    return registry.get(name).make_inputs(shape, torch.float32, "cpu", seed)


def _token_rows(kv, tables, b, p):
    bs = kv.shape[1]
    return kv[tables[b, p // bs].long(), p % bs]


def _loop_attention(q, kv, tables, cu, lens, entries, n_entries, ids, ratio, window, sinks, scale):
    out = torch.empty_like(q)
    for b in range(lens.shape[0]):
        n = int(cu[b + 1] - cu[b])
        for i in range(n):
            t, p = int(cu[b]) + i, int(lens[b]) - n + i
            keys = [_token_rows(kv, tables, b, j) for j in range(max(0, p - window + 1), p + 1)]
            if ratio:
                allowed = range(min((p + 1) // ratio, int(n_entries[b])))
                if ids is not None:
                    allowed = [w for w in allowed if w in ids[t].tolist()]
                keys += [entries[b, w] for w in allowed]
            k = torch.stack(keys)                                              # [K, D]
            for h in range(q.shape[1]):
                logits = torch.cat([k @ q[t, h] * scale, sinks[h:h + 1]])
                out[t, h] = torch.softmax(logits, 0)[:-1] @ k
    return out


@pytest.mark.parametrize("shape", registry.get("compressed_attention").examples)
def test_compressed_attention_matches_per_token_loop(shape):
    args = _inputs("compressed_attention", shape)
    torch.testing.assert_close(compressed_attention(*args), _loop_attention(*args), rtol=1e-5, atol=1e-5)


def test_window_only_with_a_huge_window_is_causal_attention_with_sinks():
    shape = {"B": 1, "chunk": 4, "ctx": 9, "BS": 4, "Hq": 2, "D": 8, "W": 64, "r": 0, "topk": 0}
    q, kv, tables, cu, lens, entries, ne, ids, r, w, sinks, scale = _inputs("compressed_attention", shape)
    k = torch.stack([_token_rows(kv, tables, 0, j) for j in range(9)])
    s = torch.einsum("thd,kd->thk", q, k) * scale
    s = s.masked_fill(torch.arange(9)[None, None, :] > torch.arange(5, 9)[:, None, None], float("-inf"))
    full = torch.softmax(torch.cat([s, sinks.view(1, 2, 1).expand(4, 2, 1)], -1), -1)[..., :-1]
    torch.testing.assert_close(compressed_attention(q, kv, tables, cu, lens, entries, ne, ids, r, w, sinks, scale),
                               torch.einsum("thk,kd->thd", full, k), rtol=1e-5, atol=1e-5)


def test_entries_change_the_output_only_when_attended():
    shape = {"B": 1, "chunk": 1, "ctx": 23, "BS": 4, "Hq": 2, "D": 8, "W": 4, "r": 4, "topk": 0}
    args = list(_inputs("compressed_attention", shape))
    base = compressed_attention(*args)
    args[5] = args[5].clone()
    args[5][0, 5:] += 3.0                       # entries 5.. lie past (22 + 1) // 4 = 5: never visible
    torch.testing.assert_close(compressed_attention(*args), base)
    args[5][0, 0] += 3.0
    assert not torch.allclose(compressed_attention(*args), base)


def test_indexer_picks_the_best_causal_entries():
    q, w, keys, n_entries, cu, lens, r, topk = _inputs("csa_indexer", {"B": 2, "chunk": 3, "ctx": 21, "BS": 4, "Hi": 2,
                                                                      "Di": 8, "r": 4, "topk": 3})
    got = csa_indexer(q, w, keys, n_entries, cu, lens, r, topk)
    for b in range(2):
        for i in range(3):
            t, p = 3 * b + i, int(lens[b]) - 3 + i
            live = list(range(min((p + 1) // r, int(n_entries[b]))))
            sc = {e: float(sum(w[t, h] * torch.relu(q[t, h] @ keys[b, e]) for h in range(2))) for e in live}
            best = sorted(sorted(live, key=lambda e: -sc[e])[:topk])
            want = best + [-1] * (topk - len(best))
            assert sorted(got[t].tolist(), key=lambda v: (v < 0, v)) == want


def test_query_chunks_give_the_same_result(monkeypatch):
    """The references gather keys in query chunks within GATHER_BUDGET (a long prefill in bounded memory): one
    query per chunk gives exactly the one-chunk result."""
    from persistent_engine.ops import csa, registry

    for name in ("compressed_attention", "csa_indexer"):
        d = registry.get(name)
        for ex in d.examples:
            args = d.make_inputs(ex, torch.float32, "cpu", 3)
            whole = d.reference(*args)
            monkeypatch.setattr(csa, "GATHER_BUDGET", 1)
            assert torch.equal(d.reference(*args), whole), (name, ex)
            monkeypatch.undo()
