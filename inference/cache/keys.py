"""Prefix keys of a request's full blocks, and the keys of ended requests kept for their next turn.

A block's key chains its parent's hash, its tokens and extra keys (`BlockKey`); a request's keys
are built lazily, block by block, as its tokens become known (`extend_keys`). An agent's next turn
is a new request whose prompt starts with the previous turn's: building its keys from scratch
costs a tuple and a hash per block of the whole transcript (~90-150 ms at 1M tokens). When the
layer that built the prompt vouches for the shared start (`PrefixLink`), the new request starts
from the previous one's keys instead (`KeptKeys.seed`: one list copy) and builds only the rest.

An entry also holds the references of the ended request's cached full blocks (`held`): the next
turn takes them over (`adopt`) instead of each block going back to the LRU at the end of a turn and
being taken out of it again at the start of the next (two passes over the transcript's blocks).
Held blocks are released to the pool's LRU when the entry goes, and whenever an allocation is
short (`release_oldest`), so holding never makes an allocation fail.

`KeptKeys` is an LRU bounded by the number of requests and the number of keys in all; an entry
missing (never kept, evicted, released) only means more work: never a different answer.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

from inference.cache.block_pool import BlockKey, BlockPool
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

    def __init__(
        self, max_sets: int, max_blocks: int, release: Callable[[list[int]], None] = lambda blocks: None
    ) -> None:
        """`release`: gives back the references on held blocks (the pool's LRU takes them)."""
        self.max_sets = max_sets
        self.max_blocks = max_blocks
        self._sets: OrderedDict[str, list[BlockKey]] = OrderedDict()
        self._blocks = 0
        self._held: dict[str, list[int]] = {}  # name -> blocks whose references the entry holds
        self.num_held = 0
        self.release = release
        self.reused = 0  # keys copied into new requests instead of built
        self.refused = 0  # links whose prompt did not match the kept keys (a caller's bug)

    def __contains__(self, name: str) -> bool:
        return name in self._sets

    def __len__(self) -> int:
        return len(self._sets)

    @property
    def num_blocks(self) -> int:
        return self._blocks

    def put(
        self, name: str, keys: list[BlockKey], replaces: str | None = None, held: list[int] | None = None
    ) -> None:
        """Keep `keys` (the caller hands the list over: it is not copied) under `name`, in place
        of the keys kept as `replaces` (the turn they extend: the next turn extends this one; a
        second request extending it, e.g. a retry, builds its keys again). `held`: blocks
        holding `keys[:len(held)]` whose references the entry takes over."""
        for old_name in (name, replaces):
            if old_name is not None:
                self._drop(old_name)
        if not keys or len(keys) > self.max_blocks or not self.max_sets:
            if held:
                self.release(held)
            return
        self._sets[name] = keys
        self._blocks += len(keys)
        if held:
            self._held[name] = held
            self.num_held += len(held)
        while len(self._sets) > self.max_sets or self._blocks > self.max_blocks:
            self._drop(next(iter(self._sets)))

    def _drop(self, name: str) -> None:
        old = self._sets.pop(name, None)
        if old is not None:
            self._blocks -= len(old)
        self._unhold(name)

    def _unhold(self, name: str, keep: int = 0) -> None:
        held = self._held.pop(name, None)
        if held:
            self.num_held -= len(held)
            if held[keep:]:
                self.release(held[keep:])

    def held(self, name: str | None) -> list[int]:
        """The blocks whose references the entry `name` holds (do not change the list)."""
        return self._held.get(name, []) if name is not None else []

    def adopt(self, name: str, n: int) -> None:
        """A request takes over the references on the first `n` held blocks of `name`; the
        entry gives back the others."""
        self._unhold(name, keep=n)

    def release_oldest(self) -> bool:
        """Give back the held blocks of the least recently used entry holding any; False if none."""
        for name in self._sets:
            if name in self._held:
                self._unhold(name)
                return True
        return False

    def release_all(self) -> None:
        for name in list(self._held):
            self._unhold(name)

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

    def check_invariants(self, pool: BlockPool) -> None:
        """Held blocks are in use and cached under their entry's keys; the counts add up."""
        if self.num_held != sum(map(len, self._held.values())) or not self._held.keys() <= self._sets.keys():
            raise AssertionError("kept keys: held block counts are inconsistent")
        for name, held in self._held.items():
            for b, key in zip(held, self._sets[name], strict=False):
                if pool.ref_cnt[b] <= 0 or pool.key_of(b) != key:
                    raise AssertionError(f"kept keys: held block {b} of {name!r} is not cached in use")

    def clear(self) -> None:
        self.release_all()
        self._sets.clear()
        self._blocks = 0


def common_len(a: Sequence[int], b: list[int]) -> int:
    """The length of the common start of `a` and `b`."""
    n = min(len(a), len(b))
    if list(a[:n]) == b[:n]:  # the usual case, in one pass
        return n
    i = 0
    while a[i] == b[i]:
        i += 1
    return i
