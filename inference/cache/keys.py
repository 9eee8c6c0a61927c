"""Prefix keys of a request's full blocks, and the keys of ended requests kept for their next turn.

A block's key chains its parent's hash, its tokens and extra keys (`BlockKey`); a request's keys
are built lazily, block by block, as its tokens become known (`extend_keys`). An agent's next turn
is a new request whose prompt starts with the previous turn's: building its keys from scratch
costs a tuple and a hash per block of the whole transcript (~90-150 ms at 1M tokens). When the
layer that built the prompt vouches for the shared start (`PrefixLink`), the new request starts
from the previous one's keys instead (`KeptKeys.seed`: one list copy) and builds only the rest.

`KeptKeys` is an LRU bounded by the number of requests and the number of keys in all; an entry
missing (never kept, evicted) only means the keys are built again: never a different answer.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from inference.cache.block_pool import BlockKey
from inference.cache.records import MMSpan, extra_keys


def extend_keys(keys: list[BlockKey], token_ids: Sequence[int], mm: Sequence[MMSpan], B: int) -> None:
    """Append to `keys` the keys of the full blocks of `token_ids` it lacks (in place)."""
    n = len(token_ids) // B
    j = len(keys)
    parent = keys[-1].hash if keys else None
    if not mm:
        while j < n:
            key = BlockKey(parent, tuple(token_ids[j * B : (j + 1) * B]))
            keys.append(key)
            parent = key.hash
            j += 1
        return
    while j < n:
        lo, hi = j * B, (j + 1) * B
        key = BlockKey(parent, tuple(token_ids[lo:hi]), extra_keys(mm, lo, hi))
        keys.append(key)
        parent = key.hash
        j += 1


class KeptKeys:
    """Block keys of ended requests by `PrefixLink.name`, least recently used dropped first."""

    def __init__(self, max_sets: int, max_blocks: int) -> None:
        self.max_sets = max_sets
        self.max_blocks = max_blocks
        self._sets: OrderedDict[str, list[BlockKey]] = OrderedDict()
        self._blocks = 0
        self.reused = 0  # keys copied into new requests instead of built
        self.refused = 0  # links whose prompt did not match the kept keys (a caller's bug)

    def __contains__(self, name: str) -> bool:
        return name in self._sets

    def __len__(self) -> int:
        return len(self._sets)

    @property
    def num_blocks(self) -> int:
        return self._blocks

    def put(self, name: str, keys: list[BlockKey], replaces: str | None = None) -> None:
        """Keep `keys` (the caller hands the list over: it is not copied) under `name`, in place
        of the keys kept as `replaces` (the turn they extend: the next turn extends this one; a
        second request extending it, e.g. a retry, builds its keys again)."""
        for old_name in (name, replaces):
            old = self._sets.pop(old_name, None) if old_name is not None else None
            if old is not None:
                self._blocks -= len(old)
        if not keys or len(keys) > self.max_blocks or not self.max_sets:
            return
        self._sets[name] = keys
        self._blocks += len(keys)
        while len(self._sets) > self.max_sets or self._blocks > self.max_blocks:
            _, dropped = self._sets.popitem(last=False)
            self._blocks -= len(dropped)

    def seed(self, name: str, num_blocks: int, token_ids: Sequence[int], B: int) -> list[BlockKey]:
        """A new list of the first `num_blocks` keys kept under `name` (fewer if it has fewer;
        none if it is not kept). The caller vouches that `token_ids` starts with the tokens those
        keys were built from; the last block is compared anyway (O(B)), as a guard against a
        link to the wrong request: on a difference none are reused (counted in `refused`)."""
        kept = self._sets.get(name)
        if kept is None or num_blocks <= 0:
            return []
        self._sets.move_to_end(name)
        n = min(num_blocks, len(kept), len(token_ids) // B)
        if n and kept[n - 1].tokens != tuple(token_ids[(n - 1) * B : n * B]):
            self.refused += 1
            return []
        self.reused += n
        return kept[:n]

    def clear(self) -> None:
        self._sets.clear()
        self._blocks = 0
