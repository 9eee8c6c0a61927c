"""Pool of fixed-size KV blocks: reference counts, a free list and a phase-aware eviction LRU.

A block holds `block_size` token positions of MLA latent KV (and DSA indexer keys) for every
full-attention layer; the tensors live in the model's `HybridCacheTensors`, this file only
tracks ids. Invariants (checked by `check_invariants`):

- every block id is in exactly one place: in use (ref_cnt > 0), the plain free list
  (ref_cnt == 0, no hash) or one of the eviction LRUs (ref_cnt == 0, hashed);
- a block is hashed iff it is in `_hash_to_block` under its own key;
- a hashed block's tokens never change (block tables are append-only, full blocks only).

Eviction order ("aware of request phase"): a block released by a request whose tokens were
produced while decoding, or by a preempted/aborted request, goes to the low-priority LRU; a
block holding prompt tokens of a finished request (the transcript the next agent turn
re-sends) goes to the high-priority LRU. Allocation takes plain free blocks first, then evicts
from the low LRU, then from the high LRU, least recently used first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field

LOW, HIGH = 0, 1  # eviction priority of a released cached block


@dataclass(frozen=True, slots=True)
class BlockKey:
    """Identity of a full block's contents: the parent's hash, its tokens and extra keys. The hash
    is computed once, at construction (a key is looked up every turn that re-sends its block)."""

    parent: int | None
    tokens: tuple[int, ...]
    extra: tuple[Hashable, ...] = ()
    hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "hash", hash((self.parent, self.tokens, self.extra)))


class BlockPool:
    """Reference-counted KV blocks with a free list and a two-level LRU of cached blocks."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_cnt = [0] * num_blocks
        self._key: list[BlockKey | None] = [None] * num_blocks
        self._hash_to_block: dict[int, int] = {}
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() gives low ids first
        self._lru: tuple[OrderedDict[int, None], OrderedDict[int, None]] = (OrderedDict(), OrderedDict())
        # (block_id, key, priority) listener, called before the block is handed out again
        self.on_evict: Callable[[int, BlockKey, int], None] | None = None
        self.num_evictions = 0

    # -- queries ---------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks that can be handed out now (plain free + evictable cached)."""
        return len(self._free) + len(self._lru[LOW]) + len(self._lru[HIGH])

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def usage(self) -> float:
        return self.num_used / self.num_blocks

    def lookup(self, key: BlockKey) -> int | None:
        """The cached block holding exactly `key`'s contents, or None (tokens compared)."""
        block = self._hash_to_block.get(key.hash)
        if block is None:
            return None
        held = self._key[block]
        return block if held is key or held == key else None

    def lookup_all(self, keys: list[BlockKey]) -> list[int] | None:
        """The cached blocks holding every one of `keys`, or None if any is missing (tokens
        compared). One pass at C speed: a long conversation's reused keys are checked per turn."""
        try:
            blocks = list(map(self._hash_to_block.__getitem__, [k.hash for k in keys]))
        except KeyError:
            return None
        return blocks if list(map(self._key.__getitem__, blocks)) == keys else None

    def key_of(self, block: int) -> BlockKey | None:
        return self._key[block]

    def registered_run(self, blocks: list[int], keys: list[BlockKey]) -> int:
        """How many leading `blocks` are cached under exactly the matching `keys` (one pass)."""
        n = min(len(blocks), len(keys))
        if list(map(self._key.__getitem__, blocks[:n])) == keys[:n]:
            return n
        i = 0
        while self._key[blocks[i]] == keys[i]:
            i += 1
        return i

    # -- mutation --------------------------------------------------------------------------
    def allocate(self, n: int) -> list[int] | None:
        """Hand out `n` blocks with ref_cnt 1, evicting cached ones if needed; None if short."""
        if n > self.num_free:
            return None
        out = []
        for _ in range(n):
            if self._free:
                block = self._free.pop()
            else:
                prio = LOW if self._lru[LOW] else HIGH
                block, _ = self._lru[prio].popitem(last=False)
                self._uncache(block, prio)
                self.num_evictions += 1
            self.ref_cnt[block] = 1
            out.append(block)
        return out

    def touch(self, blocks: Iterable[int]) -> None:
        """Take a reference on cached blocks (a prefix hit); removes them from the LRU."""
        # one tight loop: a long conversation's turn touches every block of its transcript
        ref, key = self.ref_cnt, self._key
        low, high = self._lru
        for b in blocks:
            c = ref[b]
            if not c:
                if key[b] is None:
                    raise ValueError(f"block {b} is free and uncached; it cannot be shared")
                if b in high:
                    del high[b]
                else:
                    low.pop(b, None)
            ref[b] = c + 1

    def free(self, blocks: Iterable[int], priorities: Iterable[int] | int | None = None) -> None:
        """Drop one reference from each block. Pass blocks tail-first: they are evicted first.
        `priorities`: one per block, or one for all (None: LOW)."""
        if priorities is None or isinstance(priorities, int):
            self._free_all(blocks, LOW if priorities is None else priorities)
            return
        blocks = list(blocks)
        prios = list(priorities)
        for b, prio in zip(blocks, prios, strict=True):
            self._free_all((b,), prio)

    def _free_all(self, blocks: Iterable[int], prio: int) -> None:
        ref, key, lru, free = self.ref_cnt, self._key, self._lru[prio], self._free
        for b in blocks:
            c = ref[b]
            if c == 1:
                ref[b] = 0
                if key[b] is None:
                    free.append(b)
                else:
                    lru[b] = None
            elif c > 1:
                ref[b] = c - 1
            else:
                raise ValueError(f"block {b} freed more often than taken")

    def cache(self, block_id: int, key: BlockKey) -> int:
        """Register a full, computed block under `key`. Returns the block now holding the key
        (an earlier identical block wins; the caller's block then simply stays uncached)."""
        h = key.hash
        existing = self._hash_to_block.get(h)
        if existing is not None:
            return existing
        if self._key[block_id] is not None:
            raise ValueError(f"block {block_id} is already cached")
        self._key[block_id] = key
        self._hash_to_block[h] = block_id
        return block_id

    def _uncache(self, block: int, priority: int = LOW) -> None:
        key = self._key[block]
        if key is None:
            return
        del self._hash_to_block[key.hash]
        self._key[block] = None
        if self.on_evict is not None:
            self.on_evict(block, key, priority)

    def reset_cache(self) -> None:
        """Forget every cached-but-free block (for benchmarks: a cold cache)."""
        for lru in self._lru:
            while lru:
                b, _ = lru.popitem(last=False)
                self._uncache(b)
                self._free.append(b)

    def check_invariants(self) -> None:
        seen: set[int] = set()
        for b in self._free:
            if b in seen or self.ref_cnt[b] != 0 or self._key[b] is not None:
                raise AssertionError(f"free-list block {b} is inconsistent")
            seen.add(b)
        for lru in self._lru:
            for b in lru:
                if b in seen or self.ref_cnt[b] != 0 or self._key[b] is None:
                    raise AssertionError(f"LRU block {b} is inconsistent")
                seen.add(b)
        for b in range(self.num_blocks):
            if b not in seen and self.ref_cnt[b] <= 0:
                raise AssertionError(f"block {b} is lost (ref_cnt {self.ref_cnt[b]})")
        for h, b in self._hash_to_block.items():
            if self._key[b] is None or self._key[b].hash != h:
                raise AssertionError(f"hash map entry for block {b} is stale")
