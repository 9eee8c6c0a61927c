"""One bookkeeping over the two pools: KV blocks (full attention) and state slots (KDA).

THE CHECKPOINT RULE (what makes a prefix hit exact on a hybrid model)
--------------------------------------------------------------------
A KDA layer's recurrent state after token t summarises the whole prefix and cannot be cut at an
arbitrary token, so a prefix hit needs, besides the KV of the prefix, a snapshot of the state
taken at exactly the hit position. With B = block_size and I = checkpoint_interval (a multiple
of B), a request leaves a checkpoint (a state snapshot) at these positions p, and only there:

1. every multiple of I it computes (prefill chunks are cut there: `next_prefill_cut`), so that
   different conversations sharing a long start can resume inside it;
2. the end of its prompt, p = prompt_len, right after the step that computed the last prompt
   token (a step end anyway: no extra cut);
3. the end of its generation, p = num_computed_tokens when it finishes normally (all tokens but
   the last sampled one) — the point the next agent turn, which re-sends the transcript, resumes;
4. inside its prompt, where another prompt is likely to diverge (prefill chunks are cut there too):
   the last block boundary before the prompt's end, so the same prompt sent again reuses all but
   its last block (the prompt-end checkpoint cannot serve it: a hit leaves >= 1 token to compute),
   and the end of every chat message (`message_ends`, from the rendered template), so a shared
   system prompt (or tool declaration) is reused whole whatever follows it.
   Rules 1 and 4 do not cut a prompt resumed from a prefix hit when all of its rest fits in one
   step (`max_num_batched_tokens`): a returning agent turn is prefilled in one step, not one per
   position. The hit it resumed from sits just before those tokens, so a repeat or a branch of
   the turn recomputes at most one step's worth, in one step, with or without them.
A checkpoint at a block boundary is keyed by the chained hash of the full block ending there. One
at p = jB + r (0 < r < B) is keyed by (hash of block j-1, tokens [jB, p), extra keys) and owns a
private copy of the KV block holding [jB, p), since that block is not full and never shared.

A request with N tokens hits at the deepest p <= N - 1 (at least one token is computed, for
logits) such that every full block before p is cached with matching tokens and a checkpoint
matching tokens [0, p) exists. It then shares those full blocks, gets a fresh block holding a
copy of the checkpoint's partial block (if any), and starts from a copy of the checkpoint's
state in a fresh live slot; without a hit the live slot is zeroed. Keys are compared exactly
(tokens, parent, extra keys), never by hash alone. With this rule the computation after a hit is
the computation without it, so outputs with and without the cache are identical (the model
makes chunked prefill equal to one-shot prefill).

Order of tensor operations in a step (the runner follows `SchedulerOutput`): deferred
end-of-generation snapshots and their block copies, then checkpoint -> live copies and partial
block copies, then zeroing of fresh slots, then the forward, then this step's snapshots.

Invariants: a request's block table is append-only; blocks[j] is cached only once tokens
[jB, (j+1)B) are computed; a checkpoint is used only after the operation writing it is ordered
before the use; a checkpoint that is a copy source or a pending write is pinned.
"""

from __future__ import annotations

from collections.abc import Sequence

from inference.cache.block_pool import HIGH, LOW, BlockKey, BlockPool
from inference.cache.keys import KeptKeys, common_len, extend_keys
from inference.cache.promotion import Promoter
from inference.cache.records import (
    Allocation,
    CacheConfig,
    MMSpan,
    PrefixHit,
    PrefixLink,
    ReqCache,
    Snapshot,
    TailKey,
    extra_keys,
)
from inference.cache.state_pool import Checkpoint, StatePool
from inference.cache.tier_access import TierAccess
from inference.cache.tiers import TierIndex, tier_capacity


class HybridCacheCoordinator(TierAccess):
    """Reconciles prefix hits across KV blocks and state checkpoints; owns block tables."""

    def __init__(self, config: CacheConfig, *, block_bytes: int = 1, state_bytes: int = 1) -> None:
        """`block_bytes` / `state_bytes`: one KV block's and one state slot's size (tier capacity)."""
        self.config = config
        self.B = config.block_size
        self.blocks = BlockPool(config.num_blocks, config.block_size)
        self.states = StatePool(config.num_state_slots)
        self.blocks.on_evict = self._on_block_evicted
        self.states.on_evict = self._on_checkpoint_dropped
        self._reqs: dict[str, ReqCache] = {}
        self._pinned: list[int] = []  # checkpoint keys pinned for the step being run
        self._deferred_pins: list[int] = []  # pinned for the next step (deferred snapshots)
        self._tails: dict[int | None, dict[int, TailKey]] = {}  # parent hash -> in-block checkpoints
        self._ckpt_block: dict[int, int] = {}  # checkpoint key -> its private partial block
        # keys (and block references) of ended requests, for the turns that extend them: keys.py
        self.kept = KeptKeys(
            config.kept_key_sets, config.kept_key_blocks, lambda held: self.blocks.free(reversed(held), HIGH)
        )
        self._links: dict[str, PrefixLink] = {}  # requests in the engine that have one
        # Tiers below the GPU (see tiers.py / promotion.py): evicted entries worth keeping go
        # there instead of being forgotten; a deeper hit found there is promoted before admission.
        self.tiers: TierIndex | None = None
        self.promoter: Promoter | None = None
        if config.tiers.enabled and config.enable_prefix_caching:
            cap = tier_capacity(config.tiers, block_bytes, state_bytes)
            self.tiers = TierIndex(cap, block_bytes, state_bytes)
            self.promoter = Promoter(self)
        self._offloading = True  # off while a cold-cache reset forgets everything
        self._no_store = False  # set while dropping the checkpoints of a block that was not kept
        # blocks and checkpoints of long sequences (offload_min_tokens); two sets: a checkpoint at a
        # block boundary has the key of the block that ends there
        self._worth_blocks: set[int] = set()
        self._worth_ckpts: set[int] = set()

    # -- keys ------------------------------------------------------------------------------
    def _keys(self, rc: ReqCache, token_ids: Sequence[int], mm: Sequence[MMSpan]) -> list[BlockKey]:
        if (len(rc.keys) + 1) * self.B <= len(token_ids):
            extend_keys(rc.keys, token_ids, mm, self.B)
        return rc.keys

    def link(self, req_id: str, link: PrefixLink) -> None:
        """State where a request's prompt comes from (before it is first scheduled); a request
        with images has none (its keys carry the images' content keys)."""
        self._links[req_id] = link

    def _rc(self, req_id: str, token_ids: Sequence[int]) -> ReqCache:
        rc = self._reqs.get(req_id)
        if rc is None:
            rc = self._reqs[req_id] = ReqCache()
            link = self._links.get(req_id)
            if link is not None and link.extends is not None:  # the shared start's keys, copied
                rc.keys = self.kept.seed(link.extends, link.num_shared // self.B, token_ids, self.B)
                rc.num_linked, rc.linked_from = len(rc.keys), link.extends
        return rc

    def _ident(self, rc: ReqCache, token_ids: Sequence[int], p: int, mm: Sequence[MMSpan]):
        """(key, identity) of a checkpoint at position p of this sequence."""
        keys = self._keys(rc, token_ids, mm)
        j, r = divmod(p, self.B)
        if r == 0:
            return keys[j - 1].hash, keys[j - 1]
        tail = TailKey(
            keys[j - 1].hash if j else None, tuple(token_ids[j * self.B : p]), extra_keys(mm, j * self.B, p)
        )
        return tail.hash, tail

    # -- prefix hit ------------------------------------------------------------------------
    def find_hit(self, req_id: str, token_ids: Sequence[int], mm: Sequence[MMSpan] = ()) -> PrefixHit:
        """Deepest usable hit under the checkpoint rule; takes nothing."""
        if not self.config.enable_prefix_caching:
            return PrefixHit()
        B, limit = self.B, len(token_ids) - 1
        rc = self._rc(req_id, token_ids)
        keys = self._keys(rc, token_ids, mm)
        # a linked request's copied keys are checked in one pass, and the checkpoints among them
        # searched from their end, only when none lies past them: O(new tokens) in Python
        k = min(rc.num_linked, limit // B)
        held = self.kept.held(rc.linked_from)  # held since it ended: cached under these very keys
        blocks = held[:k] if len(held) >= k else self.blocks.lookup_all(keys[:k]) or []
        j0 = j = len(blocks)
        best = PrefixHit()
        while True:
            best = self._tail_hit(j, keys, blocks, token_ids, mm, limit, best)
            if j == len(keys) or (j + 1) * B > limit:
                break
            block = self.blocks.lookup(keys[j])
            if block is None:
                break
            blocks.append(block)
            j += 1
            best = self._boundary_hit(j, keys, blocks, best)
        for j in range(j0, 0, -1) if not best.num_tokens else ():
            best = self._boundary_hit(j, keys, blocks, best)
            if not best.num_tokens:
                best = self._tail_hit(j - 1, keys, blocks, token_ids, mm, limit, best)
            if best.num_tokens:
                break
        return best

    def _tail_hit(self, j: int, keys, blocks, token_ids, mm, limit: int, best: PrefixHit) -> PrefixHit:
        """The deepest checkpoint inside block j (after the j full blocks `blocks[:j]`) deeper
        than `best`, else `best`."""
        B = self.B
        for key, tail in self._tails.get(keys[j - 1].hash if j else None, {}).items():
            p = j * B + len(tail.tokens)
            if p <= best.num_tokens or p > limit or tuple(token_ids[j * B : p]) != tail.tokens:
                continue
            ck = self.states.get_checkpoint(key)
            if ck is not None and ck.ident == tail and tail.extra == extra_keys(mm, j * B, p):
                best = PrefixHit(p, tuple(blocks[:j]), key, self._ckpt_block[key])
        return best

    def _boundary_hit(self, j: int, keys, blocks, best: PrefixHit) -> PrefixHit:
        """The checkpoint at the end of full block j-1 if deeper than `best` (a hit refreshes
        every checkpoint on its path in the LRU), else `best`."""
        ck = self.states.get_checkpoint(keys[j - 1].hash)
        if ck is not None and ck.ident == keys[j - 1] and j * self.B > best.num_tokens:
            return PrefixHit(j * self.B, tuple(blocks[:j]), keys[j - 1].hash)
        return best

    # -- allocation ------------------------------------------------------------------------
    def _allocate_blocks(self, n: int) -> list[int] | None:
        """n blocks, giving back held blocks of ended requests, then checkpoints' private blocks
        (LRU first) if the pool is short."""
        while n > self.blocks.num_free and self.kept.release_oldest():
            pass
        if n > self.blocks.num_free:
            for ck in self.states.evictable():
                if n <= self.blocks.num_free:
                    break
                if ck.key in self._ckpt_block:
                    self.states.drop_checkpoint(ck.key)
        return self.blocks.allocate(n)

    def allocate(self, req_id: str, hit: PrefixHit, num_computed: int, num_new: int) -> Allocation | None:
        """Blocks (and, for a new sequence, a live slot) for computing `num_new` more tokens.
        Returns None, changing nothing, if the pools are short."""
        rc = self._reqs.get(req_id)
        if rc is None:
            rc = self._reqs[req_id] = ReqCache()
        elif rc.no_new is not None and -(-(num_computed + num_new) // self.B) <= len(rc.block_ids):
            # a running sequence whose blocks cover the step (most decode steps): the general path
            # below would take no block and copy nothing, so skip straight to its answer
            return rc.no_new
        fresh = rc.slot is None
        copy_from = None
        if fresh:
            if rc.block_ids:
                raise ValueError(f"request {req_id} has blocks but no slot")
            if hit.num_tokens != num_computed:
                raise ValueError("a new sequence must start at its prefix hit")
            if hit.checkpoint_key is not None:
                self.states.pin(hit.checkpoint_key)  # before any slot or block is taken
            # the references the turn it extends held on these blocks since it ended are taken
            # over (and given back with the hit's if this fails: the blocks stay cached)
            adopt = common_len(hit.block_ids, self.kept.held(rc.linked_from))
            if rc.linked_from is not None:
                self.kept.adopt(rc.linked_from, adopt)
            self.blocks.touch(hit.block_ids[adopt:])
            slot = self.states.allocate_live(req_id)
            if slot is None:
                self._undo_hit(hit)
                return None
            if hit.checkpoint_key is not None:
                copy_from = self.states.get_checkpoint(hit.checkpoint_key).slot
        held = len(hit.block_ids) if fresh else len(rc.block_ids)
        need = -(-(num_computed + num_new) // self.B) - held
        new = self._allocate_blocks(max(need, 0))
        if new is None:
            if fresh:
                self.states.free_live(slot)
                self._undo_hit(hit)
            return None
        block_copy = None
        if fresh:
            rc.slot = slot
            rc.no_new = Allocation((), slot)
            rc.block_ids = list(hit.block_ids)
            rc.num_cached = len(hit.block_ids)
            if hit.checkpoint_key is not None:
                self._pinned.append(hit.checkpoint_key)
            if hit.partial_block is not None:
                block_copy = (hit.partial_block, new[0])  # copy-on-write of the partial block
        rc.block_ids.extend(new)
        if fresh and self.promoter is not None:
            self.promoter.release(req_id)  # the hit holds the promoted prefix from now on
        return Allocation(tuple(new), rc.slot, copy_from, fresh and copy_from is None, block_copy)

    def _undo_hit(self, hit: PrefixHit) -> None:
        self.blocks.free(reversed(hit.block_ids), HIGH)
        if hit.checkpoint_key is not None:
            self.states.unpin(hit.checkpoint_key)

    def block_ids(self, req_id: str) -> list[int]:
        return self._reqs[req_id].block_ids

    def slot(self, req_id: str) -> int | None:
        rc = self._reqs.get(req_id)
        return None if rc is None else rc.slot

    # -- checkpoints -----------------------------------------------------------------------
    def prompt_marks(self, prompt_len: int, message_ends: Sequence[int] = ()) -> list[int]:
        """Rule 4's positions inside a prompt of `prompt_len` tokens, ascending."""
        marks = {p for p in message_ends if 0 < p < prompt_len}
        last_boundary = (prompt_len - 1) // self.B * self.B
        if last_boundary > 0:
            marks.add(last_boundary)
        return sorted(marks)

    def next_prefill_cut(
        self,
        num_computed: int,
        prompt_len: int,
        message_ends: Sequence[int] = (),
        *,
        resumed_within: int = 0,
    ) -> int | None:
        """The first position after `num_computed` where a prefill chunk must end (rules 1 and 4):
        always > `num_computed` (so a one-token step is never cut: the scheduler relies on it).
        `resumed_within`: the most tokens one step computes, when this step resumes the sequence
        from a prefix hit at `num_computed` (0 otherwise): a prompt whose rest fits is not cut."""
        if not self.config.enable_prefix_caching:
            return None
        interval = self.config.checkpoint_interval
        if 0 < num_computed < prompt_len and prompt_len - num_computed <= resumed_within:
            return (((prompt_len - 1) // interval) + 1) * interval  # past the prompt: rule 1 as ever
        cut = (num_computed // interval + 1) * interval
        for p in self.prompt_marks(prompt_len, message_ends):
            if p > num_computed:
                return min(cut, p)
        return cut

    def _reserve(self, req_id: str, token_ids: Sequence[int], p: int, priority: int, mm) -> Snapshot | None:
        rc = self._reqs[req_id]
        key, ident = self._ident(rc, token_ids, p, mm)
        self._flag_worth(rc, key, p)
        if self.states.has_checkpoint(key):
            if priority == HIGH:  # e.g. an interval snapshot that is also a resume point
                self.states.set_priority(key, HIGH)
            return None
        block = None
        if isinstance(ident, TailKey):
            got = self._allocate_blocks(1)
            if got is None:
                return None
            block = got[0]
        ck = self.states.reserve_checkpoint(key, p, priority, ident=ident)
        if ck is None:
            if block is not None:
                self.blocks.free([block])
            return None
        copy = None
        if block is not None:
            self._ckpt_block[key] = block
            self._tails.setdefault(ident.parent, {})[key] = ident
            copy = (rc.block_ids[p // self.B], block)
        rc.pending.append(key)
        return Snapshot(rc.slot, ck.slot, copy)

    def plan_checkpoint(
        self,
        req_id: str,
        token_ids: Sequence[int],
        end: int,
        prompt_len: int,
        mm: Sequence[MMSpan] = (),
        message_ends: Sequence[int] = (),
    ) -> Snapshot | None:
        """A snapshot to take right after this step's forward if it ends at a checkpoint
        position (rule 1: interval multiples; rule 2: the end of the prompt; rule 4: the last
        block boundary of the prompt and the message ends)."""
        if not self.config.enable_prefix_caching or end <= 0:
            return None
        if end == prompt_len or (end < prompt_len and end in self.prompt_marks(prompt_len, message_ends)):
            return self._reserve(req_id, token_ids, end, HIGH, mm)
        if end % self.config.checkpoint_interval == 0:
            return self._reserve(req_id, token_ids, end, LOW, mm)
        return None

    def finish_checkpoint(
        self, req_id: str, token_ids: Sequence[int], num_computed: int, mm: Sequence[MMSpan] = ()
    ) -> Snapshot | None:
        """Rule 3: reserve the end-of-generation checkpoint of a request finishing normally. The
        copy runs first thing in the next step (before its slot or block can be reused)."""
        if not self.config.enable_prefix_caching or num_computed <= 0 or req_id not in self._reqs:
            return None
        snap = self._reserve(req_id, token_ids, num_computed, HIGH, mm)
        if snap is not None:
            key = self._reqs[req_id].pending.pop()
            self.states.commit(key)  # usable from the next step on: its copy is ordered first
            self.states.pin(key)
            self._deferred_pins.append(key)
        return snap

    # -- after the step --------------------------------------------------------------------
    def commit(
        self, req_id: str, token_ids: Sequence[int], num_computed: int, mm: Sequence[MMSpan] = ()
    ) -> None:
        """The step ran: cache newly full computed blocks and make this step's snapshots usable."""
        rc = self._reqs[req_id]
        if rc.pending:
            for key in rc.pending:
                self.states.commit(key)
            rc.pending.clear()
        if not self.config.enable_prefix_caching or (rc.num_cached + 1) * self.B > num_computed:
            return  # no block became full (most decode steps); keys stay lazy until one does
        keys = self._keys(rc, token_ids, mm)
        while (rc.num_cached + 1) * self.B <= num_computed:
            j = rc.num_cached
            self.blocks.cache(rc.block_ids[j], keys[j])
            rc.num_cached += 1

    def begin_step(self) -> None:
        """The deferred snapshots are part of the step about to be scheduled: pin them for it."""
        self._pinned.extend(self._deferred_pins)
        self._deferred_pins.clear()

    def end_step(self) -> None:
        """Release the checkpoints pinned for the step that just ran."""
        for key in self._pinned:
            self.states.unpin(key)
        self._pinned.clear()

    def free(self, req_id: str, reason: str) -> None:
        """Release a request's blocks and live slot. reason: 'finished' | 'preempted' | 'aborted'
        (phase-aware eviction: the first two keep their blocks in the HIGH LRU)."""
        if self.promoter is not None:
            self.promoter.release(req_id)
        rc = self._reqs.pop(req_id, None)
        link = self._links.get(req_id) if reason == "preempted" else self._links.pop(req_id, None)
        if rc is None:
            return
        if link is not None:
            # the next turn copies the keys and takes over the references on the cached blocks
            n = self.blocks.registered_run(rc.block_ids, rc.keys[: rc.num_cached])
            held = rc.block_ids[:n] if reason == "finished" else []
            self.kept.put(link.name, rc.keys, link.extends, held)
            rc.block_ids = rc.block_ids[len(held) :]
        for key in rc.pending:  # cannot normally happen between steps; stay consistent anyway
            self.states.commit(key)
            self.states.drop_checkpoint(key)
        prio = LOW if reason == "aborted" else HIGH
        self.blocks.free(reversed(rc.block_ids), prio)
        if rc.slot is not None:
            self.states.free_live(rc.slot)

    def forget(self, req_id: str) -> None:
        """Drop lazily computed keys of a request that never got blocks (e.g. rejected)."""
        if self.promoter is not None:
            self.promoter.release(req_id)
        self._links.pop(req_id, None)
        rc = self._reqs.get(req_id)
        if rc is not None and rc.slot is None and not rc.block_ids:
            del self._reqs[req_id]

    def _on_block_evicted(self, block_id: int, key: BlockKey, priority: int) -> None:
        h = key.hash
        kept = (
            self._offloading
            and self.tiers is not None
            and (
                self._is_worth(h, self._worth_blocks) or self.tiers.block(key) is not None
            )  # below: refreshed
            and self.tiers.store_block(block_id, key, priority)
        )
        self._worth_blocks.discard(h)
        # checkpoints at or just after this block leave the GPU with it (to the tiers if the
        # block was kept there, else they can never be used again): their slots come back
        self._no_store = not kept
        try:
            self.states.drop_checkpoint(h)
            for k in list(self._tails.get(h, {})):
                self.states.drop_checkpoint(k)
        finally:
            self._no_store = False

    def _on_checkpoint_dropped(self, ck: Checkpoint) -> None:
        block = self._ckpt_block.pop(ck.key, None)
        if (
            self.tiers is not None
            and self._offloading
            and not self._no_store
            and ck.ready  # resume points and interval snapshots alike (LOW: evicted first below)
            and (self._is_worth(ck.key, self._worth_ckpts) or self.tiers.ckpt(ck.key, ck.ident) is not None)
        ):
            self.tiers.store_ckpt(ck.key, ck.ident, ck.slot, block, ck.num_tokens, ck.priority)
        self._worth_ckpts.discard(ck.key)
        if block is not None:
            self.blocks.free([block])
            tails = self._tails.get(ck.ident.parent)
            if tails is not None:
                tails.pop(ck.key, None)
                if not tails:
                    del self._tails[ck.ident.parent]

    @property
    def num_request_blocks(self) -> int:
        """Blocks held by requests (in use, minus the checkpoints' private partial blocks)."""
        return self.blocks.num_used - len(self._ckpt_block) - self.kept.num_held

    def reset_prefix_cache(self) -> None:
        """Forget every cached block and checkpoint, on the GPU and in the tiers (a cold cache)."""
        self.kept.release_all()
        self._offloading = False
        try:
            self.states.reset_cache()
            self.blocks.reset_cache()
        finally:
            self._offloading = True
        if self.tiers is not None:
            self.tiers.clear()

    def check_invariants(self) -> None:
        self.blocks.check_invariants()
        self.kept.check_invariants(self.blocks)
        self.states.check_invariants()
        for req_id, rc in self._reqs.items():
            if rc.slot is not None and self.states.live_owner(rc.slot) != req_id:
                raise AssertionError(f"request {req_id} slot ownership is wrong")
            for b in rc.block_ids:
                if self.blocks.ref_cnt[b] <= 0:
                    raise AssertionError(f"request {req_id} holds free block {b}")
        for key, b in self._ckpt_block.items():
            if not self.states.has_checkpoint(key) or self.blocks.ref_cnt[b] != 1:
                raise AssertionError(f"checkpoint {key} block {b} is inconsistent")
        if self.tiers is not None:
            self.tiers.check_invariants()
