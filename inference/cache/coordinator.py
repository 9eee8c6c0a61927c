"""One bookkeeping over the two pools: KV blocks (full attention) and state slots (KDA).

THE CHECKPOINT RULE (what makes a prefix hit exact on a hybrid model)
--------------------------------------------------------------------
A KDA layer's recurrent state after token t summarises the whole prefix and cannot be cut at an
arbitrary token, so a prefix hit needs, besides the KV blocks, a snapshot of the state taken at
exactly the hit position. With B = block_size and I = checkpoint_interval (a multiple of B):

1. A snapshot (checkpoint) is taken only when a sequence's computed length lands exactly on a
   block boundary p (p % B == 0), right after the step that computed token p-1, and only if p is
   - a multiple of I (interval checkpoint, evicted first), or
   - the prompt's last block boundary, B * floor(prompt_len / B) (resume point), or
   - a block boundary past the prompt reached while decoding (a rolling snapshot: the previous
     rolling one of the same request is dropped unless it is also one of the above; the last one
     becomes a resume point when the request finishes).
   The scheduler cuts prefill chunks at interval multiples and at the prompt boundary so that
   these positions are always step ends (`next_prefill_cut`).
2. A checkpoint at p is keyed by the chained hash of the full block ending at p; on lookup the
   block's exact key (parent hash, tokens, extra keys) is compared, never the hash alone.
3. A request with N tokens hits at the deepest p such that p <= N - 1 (at least one token is
   computed, to get logits), every block before p is cached with matching tokens, and a ready
   checkpoint exists at p. It then shares those p/B blocks and starts from a copy of the
   checkpoint in a fresh live slot; without a hit the live slot is zeroed.
With this rule the computation after a hit is the computation without it, so outputs with and
without the cache are identical (up to chunking, which the model makes exact).

Invariants: a request holds its blocks in an append-only table; blocks[j] is cached only once
tokens [jB, (j+1)B) are computed; a checkpoint is usable only after the step that wrote it.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from inference.cache.block_pool import HIGH, LOW, BlockKey, BlockPool
from inference.cache.state_pool import StatePool


@dataclass(frozen=True, slots=True)
class CacheConfig:
    block_size: int = 16
    num_blocks: int = 1024
    num_state_slots: int = 64
    enable_prefix_caching: bool = True
    checkpoint_interval: int = 1024  # tokens; a multiple of block_size

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.num_blocks <= 0 or self.num_state_slots <= 0:
            raise ValueError("block_size, num_blocks and num_state_slots must be positive")
        if self.checkpoint_interval <= 0 or self.checkpoint_interval % self.block_size:
            raise ValueError("checkpoint_interval must be a positive multiple of block_size")


@dataclass(frozen=True, slots=True)
class MMSpan:
    """Positions [offset, offset+length) hold placeholders of an item whose content hash is `key`."""

    offset: int
    length: int
    key: Hashable


@dataclass(frozen=True, slots=True)
class PrefixHit:
    num_tokens: int = 0
    block_ids: tuple[int, ...] = ()
    checkpoint_key: int | None = None


@dataclass(frozen=True, slots=True)
class Allocation:
    """What the runner must do before the forward for one request, and its new blocks."""

    new_block_ids: tuple[int, ...]
    slot: int
    copy_from: int | None = None  # checkpoint slot to copy into `slot`
    zero: bool = False  # zero `slot` (a fresh sequence)


@dataclass(slots=True)
class _ReqCache:
    block_ids: list[int] = field(default_factory=list)
    slot: int | None = None
    keys: list[BlockKey] = field(default_factory=list)  # keys of full blocks, computed lazily
    num_cached: int = 0  # leading blocks registered in the pool (by us or shared)
    rolling: int | None = None  # key of the latest rolling decode snapshot
    pending: list[int] = field(default_factory=list)  # reserved checkpoint keys of this step


class HybridCacheCoordinator:
    """Reconciles prefix hits across KV blocks and state checkpoints; owns block tables."""

    def __init__(self, config: CacheConfig) -> None:
        self.config = config
        self.B = config.block_size
        self.blocks = BlockPool(config.num_blocks, config.block_size)
        self.states = StatePool(config.num_state_slots)
        self.blocks.on_evict = self._on_block_evicted
        self._reqs: dict[str, _ReqCache] = {}
        self._pinned: list[int] = []  # checkpoint keys pinned as copy sources this step

    # -- keys ------------------------------------------------------------------------------
    def _keys(self, rc: _ReqCache, token_ids: Sequence[int], mm: Sequence[MMSpan]) -> list[BlockKey]:
        B = self.B
        while (len(rc.keys) + 1) * B <= len(token_ids):
            j = len(rc.keys)
            lo, hi = j * B, (j + 1) * B
            extra = tuple(s.key for s in mm if s.offset < hi and s.offset + s.length > lo)
            parent = rc.keys[-1].hash if rc.keys else None
            rc.keys.append(BlockKey(parent, tuple(token_ids[lo:hi]), extra))
        return rc.keys

    def _rc(self, req_id: str) -> _ReqCache:
        rc = self._reqs.get(req_id)
        if rc is None:
            rc = self._reqs[req_id] = _ReqCache()
        return rc

    # -- prefix hit ------------------------------------------------------------------------
    def find_hit(self, req_id: str, token_ids: Sequence[int], mm: Sequence[MMSpan] = ()) -> PrefixHit:
        """Deepest usable hit under the checkpoint rule (rule 3); does not take anything."""
        if not self.config.enable_prefix_caching:
            return PrefixHit()
        keys = self._keys(self._rc(req_id), token_ids, mm)
        limit = len(token_ids) - 1
        best = PrefixHit()
        blocks: list[int] = []
        for j, key in enumerate(keys):
            if (j + 1) * self.B > limit:
                break
            block = self.blocks.lookup(key)
            if block is None:
                break
            blocks.append(block)
            ck = self.states.get_checkpoint(key.hash)
            if ck is not None and ck.ident == key and ck.num_tokens == (j + 1) * self.B:
                best = PrefixHit((j + 1) * self.B, tuple(blocks), key.hash)
        return best

    # -- allocation ------------------------------------------------------------------------
    def allocate(self, req_id: str, hit: PrefixHit, num_computed: int, num_new: int) -> Allocation | None:
        """Blocks (and, for a new sequence, a live slot) for computing `num_new` more tokens.
        Returns None, changing nothing, if the pools are short."""
        rc = self._rc(req_id)
        fresh = rc.slot is None
        copy_from = None
        if fresh:
            if rc.block_ids:
                raise ValueError(f"request {req_id} has blocks but no slot")
            if hit.num_tokens != num_computed:
                raise ValueError("a new sequence must start at its prefix hit")
            if hit.checkpoint_key is not None:
                self.states.pin(hit.checkpoint_key)  # before any slot is taken: never evicted now
            self.blocks.touch(hit.block_ids)
            slot = self.states.allocate_live(req_id)
            if slot is None:
                self._undo_hit(hit)
                return None
            if hit.checkpoint_key is not None:
                copy_from = self.states.get_checkpoint(hit.checkpoint_key).slot
        need = -(-(num_computed + num_new) // self.B) - (len(hit.block_ids) if fresh else len(rc.block_ids))
        new = self.blocks.allocate(max(need, 0))
        if new is None:
            if fresh:
                self.states.free_live(slot)
                self._undo_hit(hit)
            return None
        if fresh:
            rc.slot = slot
            rc.block_ids = list(hit.block_ids)
            rc.num_cached = len(hit.block_ids)
            if hit.checkpoint_key is not None:
                self._pinned.append(hit.checkpoint_key)
        rc.block_ids.extend(new)
        return Allocation(tuple(new), rc.slot, copy_from=copy_from, zero=fresh and copy_from is None)

    def _undo_hit(self, hit: PrefixHit) -> None:
        self.blocks.free(reversed(hit.block_ids), [HIGH] * len(hit.block_ids))
        if hit.checkpoint_key is not None:
            self.states.unpin(hit.checkpoint_key)

    def can_allocate(self, n_blocks: int) -> bool:
        return self.blocks.num_free >= n_blocks

    def block_ids(self, req_id: str) -> list[int]:
        return self._reqs[req_id].block_ids

    def slot(self, req_id: str) -> int | None:
        rc = self._reqs.get(req_id)
        return None if rc is None else rc.slot

    # -- checkpoints -----------------------------------------------------------------------
    def is_checkpoint_position(self, end: int, prompt_len: int) -> bool:
        B, interval = self.B, self.config.checkpoint_interval
        if not self.config.enable_prefix_caching or end <= 0 or end % B:
            return False
        return end % interval == 0 or end == (prompt_len // B) * B or end > prompt_len

    def next_prefill_cut(self, num_computed: int, prompt_len: int) -> int | None:
        """The first position after `num_computed` where a prefill chunk must end (rule 1)."""
        if not self.config.enable_prefix_caching:
            return None
        interval = self.config.checkpoint_interval
        cut = (num_computed // interval + 1) * interval
        pb = (prompt_len // self.B) * self.B
        if num_computed < pb < cut:
            cut = pb
        return cut

    def plan_checkpoint(
        self, req_id: str, token_ids: Sequence[int], end: int, prompt_len: int, mm: Sequence[MMSpan] = ()
    ) -> tuple[int, int] | None:
        """If the step leaves the sequence at a checkpoint position `end`, reserve a snapshot
        slot; returns (live slot, checkpoint slot) for the runner to copy after the forward."""
        if not self.is_checkpoint_position(end, prompt_len):
            return None
        rc = self._reqs[req_id]
        keys = self._keys(rc, token_ids, mm)
        key = keys[end // self.B - 1]
        resume = end == (prompt_len // self.B) * self.B
        rolling = end > prompt_len and end % self.config.checkpoint_interval != 0
        ck = self.states.reserve_checkpoint(key.hash, end, HIGH if resume else LOW, ident=key)
        if ck is None:
            return None
        if rolling:
            if rc.rolling is not None:
                self.states.drop_checkpoint(rc.rolling)
            rc.rolling = key.hash
        rc.pending.append(key.hash)
        return rc.slot, ck.slot

    # -- after the step --------------------------------------------------------------------
    def commit(
        self, req_id: str, token_ids: Sequence[int], num_computed: int, mm: Sequence[MMSpan] = ()
    ) -> None:
        """The step ran: cache newly full computed blocks and make this step's snapshots usable."""
        rc = self._reqs[req_id]
        for key in rc.pending:
            self.states.commit(key)
        rc.pending.clear()
        if not self.config.enable_prefix_caching:
            return
        keys = self._keys(rc, token_ids, mm)
        while (rc.num_cached + 1) * self.B <= num_computed:
            j = rc.num_cached
            self.blocks.cache(rc.block_ids[j], keys[j])
            rc.num_cached += 1

    def end_step(self) -> None:
        """Release the checkpoints pinned as copy sources for the step that just ran."""
        for key in self._pinned:
            self.states.unpin(key)
        self._pinned.clear()

    def free(self, req_id: str, reason: str) -> None:
        """Release a request's blocks and live slot. reason: 'finished' | 'preempted' | 'aborted'
        (phase-aware eviction: the first two keep their blocks in the HIGH LRU)."""
        rc = self._reqs.pop(req_id, None)
        if rc is None:
            return
        for key in rc.pending:  # cannot normally happen between steps; stay consistent anyway
            self.states.commit(key)
            self.states.drop_checkpoint(key)
        prio = LOW if reason == "aborted" else HIGH
        self.blocks.free(reversed(rc.block_ids), [prio] * len(rc.block_ids))
        if rc.slot is not None:
            self.states.free_live(rc.slot)
        if rc.rolling is not None and reason == "finished":
            self.states.set_priority(rc.rolling, HIGH)

    def forget(self, req_id: str) -> None:
        """Drop lazily computed keys of a request that never got blocks (e.g. rejected)."""
        rc = self._reqs.get(req_id)
        if rc is not None and rc.slot is None and not rc.block_ids:
            del self._reqs[req_id]

    def _on_block_evicted(self, block_id: int, block_hash: int) -> None:
        # the checkpoint ending at this block can never be used again: give its slot back
        self.states.drop_checkpoint(block_hash)

    def reset_prefix_cache(self) -> None:
        self.blocks.reset_cache()
        self.states.reset_cache()

    def check_invariants(self) -> None:
        self.blocks.check_invariants()
        self.states.check_invariants()
        for req_id, rc in self._reqs.items():
            if rc.slot is not None and self.states.live_owner(rc.slot) != req_id:
                raise AssertionError(f"request {req_id} slot ownership is wrong")
            for b in rc.block_ids:
                if self.blocks.ref_cnt[b] <= 0:
                    raise AssertionError(f"request {req_id} holds free block {b}")
