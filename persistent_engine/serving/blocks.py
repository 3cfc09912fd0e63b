"""The serving engine's paged-KV block manager, with prefix caching by block hashing.

The cache pools (``persistent_engine.models.kv_cache``: per layer ``k[NB, BS, Hk, Dh]``) are shared by
every request; this module only hands out block numbers. Block 0 is a scratch block that no request
owns (padded rows of a CUDA-graph batch write there). A request reserves, at admission, every block it
can ever need (prompt + max new tokens), so a running request is never preempted; this is the KV
policy the scheduler (``traffic_profiles.scheduler.KVPolicy``) calls.

Prefix caching: each full block of prompt tokens is named by a chain hash (hash of the previous
block's hash and this block's tokens), so equal hashes mean equal prefixes. Once computed, a prompt's
full blocks are registered under their hash; a later prompt with the same prefix reuses those blocks
(refcounted) and skips their prefill. A released block keeps its hash and content in an LRU free
list until it is handed out again, so hits survive the request that made them. Cost: O(prompt blocks)
dict lookups per admission.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

SCRATCH_BLOCK = 0


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, max_blocks_per_seq: int, prefix_caching: bool = True):
        if num_blocks < 2:
            raise ValueError("the KV cache needs at least 2 blocks (one is scratch)")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.max_blocks_per_seq, self.prefix_caching = max_blocks_per_seq, prefix_caching
        self.ref = [0] * num_blocks
        self.hash_of: list[int | None] = [None] * num_blocks
        self.by_hash: dict[int, int] = {}
        # free blocks, eviction order first: unhashed ones at the front, hashed ones by release time
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(1, num_blocks))
        self.tables: dict[Any, list[int]] = {}
        self.prompts: dict[Any, list[int]] = {}
        self.chain: dict[Any, list[int]] = {}       # rid -> hashes of its prompt blocks registered so far
        self.hit_tokens = 0                          # prompt tokens served from the prefix cache
        self.prompt_tokens = 0                       # prompt tokens admitted

    # ------------------------------------------------------------- the scheduler's KV policy
    def expect(self, rid: Any, prompt_ids: list[int]) -> None:
        """Tells the manager a request's prompt before the scheduler admits it."""
        self.prompts[rid] = list(prompt_ids)

    def forget(self, rid: Any) -> None:
        """Drops a request that was never admitted (aborted while waiting)."""
        self.prompts.pop(rid, None)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def admit(self, seq) -> str:
        need = self.blocks_for(seq.prompt_len + seq.max_new)
        if need > min(self.num_blocks - 1, self.max_blocks_per_seq):
            return "never"
        hits = self._prefix_hits(self.prompts[seq.rid], seq.prompt_len)
        taken_from_free = sum(1 for b in hits if self.ref[b] == 0)
        if need - len(hits) > len(self.free) - taken_from_free:
            return "wait"
        for b in hits:
            if self.ref[b] == 0:
                del self.free[b]
            self.ref[b] += 1
        fresh = [self._take_free() for _ in range(need - len(hits))]
        self.tables[seq.rid] = hits + fresh
        self.chain[seq.rid] = [self.hash_of[b] for b in hits]
        seq.computed, seq.reserved = len(hits) * self.block_size, need
        self.hit_tokens += seq.computed
        self.prompt_tokens += seq.prompt_len
        return "ok"

    def release(self, seq) -> None:
        for b in self.tables.pop(seq.rid, ()):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free[b] = None
                if self.hash_of[b] is None:
                    self.free.move_to_end(b, last=False)     # nothing to keep: hand it out first
        self.chain.pop(seq.rid, None)
        self.prompts.pop(seq.rid, None)
        seq.reserved = 0

    # ------------------------------------------------------------- prefix caching
    def commit(self, rid: Any, computed: int) -> None:
        """Registers the hashes of a request's prompt blocks that are now fully computed."""
        if not self.prefix_caching:
            return
        prompt, chain, table = self.prompts[rid], self.chain[rid], self.tables[rid]
        bs = self.block_size
        for i in range(len(chain), min(computed, len(prompt)) // bs):
            h = hash((chain[-1] if chain else None, tuple(prompt[i * bs:(i + 1) * bs])))
            chain.append(h)
            b = table[i]
            if h not in self.by_hash and self.hash_of[b] is None:
                self.by_hash[h], self.hash_of[b] = b, h

    def _prefix_hits(self, prompt: list[int], prompt_len: int) -> list[int]:
        """Cached blocks holding the longest prefix of the prompt's full blocks, leaving at least one
        prompt token to compute (its logits give the first output token)."""
        if not self.prefix_caching:
            return []
        bs, h, hits = self.block_size, None, []
        for i in range((prompt_len - 1) // bs):
            h = hash((h, tuple(prompt[i * bs:(i + 1) * bs])))
            b = self.by_hash.get(h)
            if b is None:
                break
            hits.append(b)
        return hits

    def _take_free(self) -> int:
        b, _ = self.free.popitem(last=False)
        if self.hash_of[b] is not None:                   # evicted: its prefix is no longer cached
            del self.by_hash[self.hash_of[b]]
            self.hash_of[b] = None
        self.ref[b] = 1
        return b

    # ------------------------------------------------------------- figures
    @property
    def used_blocks(self) -> int:
        return self.num_blocks - 1 - len(self.free)

    @property
    def usage(self) -> float:
        """Fraction of the cache's blocks held by running requests."""
        return self.used_blocks / (self.num_blocks - 1)

    def slot(self, rid: Any, position: int) -> int:
        """Flat cache slot (block * BS + offset) of token ``position`` of request ``rid``."""
        return self.tables[rid][position // self.block_size] * self.block_size + position % self.block_size
