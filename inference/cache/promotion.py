"""Prefix hits from the offload tiers: find them, bring them back to the GPU, hold them until the
request is admitted. Pure bookkeeping beside `HybridCacheCoordinator` (which owns one `Promoter`).

A waiting request's prefix may reach deeper than its GPU hit when blocks and a checkpoint wait in
the host or disk tier. `prepare` then starts a promotion: fresh GPU blocks (and a checkpoint slot)
are taken as targets, the tier entries are pinned, and one `Transfer` of loads goes to the runner,
which runs it asynchronously. The request is not admitted until the runner reports the transfer
done (`complete`): the promoted blocks are then registered in the block pool and the checkpoint
committed, exactly as if they had been computed, and the normal GPU prefix hit takes them. Until
the request's admission the promotion holds a reference on every block of the chain and a pin on
the checkpoint, so nothing it brought back is evicted before use.

Hybrid rule (the reason for this file): a plan always ends at a checkpoint that matches tokens
[0, p) exactly, and restores the KV chain [0, p) with it — KV and recurrent state come back
together or not at all.

Partial promotion: when the GPU pool cannot take the deepest plan back now (running requests
hold it), the deepest plan that fits is promoted instead — every checkpoint position of the walk
is a plan (a conversation leaves one at each interval multiple, prompt end, message end and
generation end, and all of them go down to the tiers) — and the tokens after it are recomputed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from inference.cache.block_pool import HIGH, BlockKey
from inference.cache.records import MMSpan, extra_keys
from inference.cache.tiers import BLOCK, DISK, HOST, TierEntry, Transfer

if TYPE_CHECKING:
    from inference.cache.coordinator import HybridCacheCoordinator


@dataclass(slots=True)
class _Plan:
    num_tokens: int
    depth: int  # full blocks of the chain before the checkpoint
    ck_key: int
    ck_entry: TierEntry | None  # None: the checkpoint is on the GPU


@dataclass(slots=True)
class _Promotion:
    id: int
    req_id: str
    held: list[int]  # GPU blocks of the chain (held for the request), chain order
    promoted: list[tuple[int, BlockKey]]  # (target block, key) arriving from a tier
    entries: list[TierEntry]
    ck_key: int
    ck_promoted: bool
    done: bool = False
    orphan: bool = False  # the request went away while the transfer was in flight


WAIT = object()  # part of the prefix is arriving for another request: try again next step


@dataclass(slots=True)
class Promoter:
    c: HybridCacheCoordinator
    promotions: dict[str, _Promotion] = field(default_factory=dict)  # by request
    by_id: dict[int, _Promotion] = field(default_factory=dict)
    inflight: set[int] = field(default_factory=set)  # block hashes and checkpoint keys arriving
    transfers: list[Transfer] = field(default_factory=list)  # started since the last take
    next_id: int = 0
    promoted_blocks: dict[int, int] = field(default_factory=lambda: {HOST: 0, DISK: 0})
    promoted_ckpts: dict[int, int] = field(default_factory=lambda: {HOST: 0, DISK: 0})
    num_partial: int = 0  # promotions of a shallower plan than the deepest (the GPU was short)

    # -- the walk --------------------------------------------------------------------------
    def plans(self, req_id: str, token_ids: Sequence[int], mm: Sequence[MMSpan]):
        """Every usable hit over the GPU and the tiers (`_Plan`s, shallowest first), or WAIT.
        Each ends at a checkpoint matching its tokens exactly, with the full KV chain before it."""
        c, tiers = self.c, self.c.tiers
        B, limit = c.B, len(token_ids) - 1
        keys = c._keys(c._rc(req_id, token_ids), token_ids, mm)
        found: list[_Plan] = []
        parent: int | None = None
        for j in range(len(keys) + 1):
            tails = [*c._tails.get(parent, {}).items(), *tiers.tails.get(parent, {}).items()]
            for key, tail in tails:
                p = j * B + len(tail.tokens)
                if p > limit or any(f.num_tokens == p for f in found[-B:]):
                    continue
                if tuple(token_ids[j * B : p]) != tail.tokens or tail.extra != extra_keys(mm, j * B, p):
                    continue
                if key in self.inflight:
                    return WAIT
                ck = c.states.get_checkpoint(key)
                if ck is not None and ck.ident == tail:
                    found.append(_Plan(p, j, key, None))
                elif (e := tiers.ckpt(key, tail)) is not None:
                    found.append(_Plan(p, j, key, e))
            if j == len(keys) or (j + 1) * B > limit:
                break
            k = keys[j]
            if c.blocks.lookup(k) is None:
                if k.hash in self.inflight:
                    return WAIT
                if tiers.block(k) is None:
                    break
            parent, p = k.hash, (j + 1) * B
            if parent in self.inflight:
                return WAIT
            ck = c.states.get_checkpoint(parent)
            if ck is not None and ck.ident == k:
                found.append(_Plan(p, j + 1, parent, None))
            elif (e := tiers.ckpt(parent, k)) is not None:
                found.append(_Plan(p, j + 1, parent, e))
        return sorted(found, key=lambda f: f.num_tokens)

    def plan(self, req_id: str, token_ids: Sequence[int], mm: Sequence[MMSpan]):
        """The deepest hit over the GPU and the tiers (a `_Plan`), None, or WAIT."""
        found = self.plans(req_id, token_ids, mm)
        return found if found is WAIT else (found[-1] if found else None)

    # -- starting and finishing ------------------------------------------------------------
    def prepare(self, req_id: str, token_ids: Sequence[int], mm: Sequence[MMSpan]) -> bool:
        """True if the request may be admitted now; False while (or after starting) a promotion.

        Partial promotion: when the GPU pool cannot take the whole prefix back now, the deepest
        plan whose blocks fit is promoted instead (a shallower checkpoint, with the KV chain
        before it: still KV and state together) and the rest is recomputed; only when none
        deeper than the GPU hit fits is the request admitted with its GPU hit alone."""
        pr = self.promotions.get(req_id)
        if pr is not None:
            return pr.done
        found = self.plans(req_id, token_ids, mm)
        if found is WAIT:
            return False
        gpu_hit = self.c.find_hit(req_id, token_ids, mm).num_tokens
        deeper = [f for f in found if f.num_tokens > gpu_hit]
        if not deeper:
            return True
        room = self._room()
        tried = 0
        for plan in reversed(deeper):
            if self._need(req_id, plan, token_ids, mm) > room:
                continue
            if self._start(req_id, plan, token_ids, mm):
                if plan is not deeper[-1]:
                    self.num_partial += 1
                return False
            tried += 1
            if tried == 2:  # the estimate was wrong twice: the pools are churning, stop here
                break
            room = self._room()
        return True

    def _room(self) -> int:
        """Blocks `_allocate_blocks` can hand out now: free and evictable cached ones, plus the
        private blocks of evictable checkpoints (an upper bound: the chain's own cached blocks,
        touched first, are among them; `_start` still checks)."""
        c = self.c
        private = sum(1 for ck in c.states.evictable() if ck.key in c._ckpt_block)
        return c.blocks.num_free + private + c.kept.num_held

    def _need(self, req_id: str, plan: _Plan, token_ids: Sequence[int], mm) -> int:
        """GPU blocks promoting `plan` takes: its chain's blocks not on the GPU, its checkpoint's
        private block, and the chain's cached GPU blocks that touching takes out of the LRU."""
        c = self.c
        keys = c._keys(c._rc(req_id, token_ids), token_ids, mm)[: plan.depth]
        need = 0
        for k in keys:
            g = c.blocks.lookup(k)
            need += g is None or c.blocks.ref_cnt[g] == 0
        if plan.ck_entry is not None and len(plan.ck_entry.units) > 1:
            need += 1
        return need

    def _start(self, req_id: str, plan: _Plan, token_ids: Sequence[int], mm) -> bool:
        c, tiers = self.c, self.c.tiers
        keys = c._keys(c._rc(req_id, token_ids), token_ids, mm)[: plan.depth]
        chain = [(k, c.blocks.lookup(k)) for k in keys]
        from_tier = [(k, tiers.block(k)) for k, g in chain if g is None]
        entries = [e for _, e in from_tier] + ([plan.ck_entry] if plan.ck_entry is not None else [])
        for e in entries:  # first: the allocations below may push entries out of the tiers
            tiers.pin(e)
        on_gpu = [g for _, g in chain if g is not None]
        c.blocks.touch(on_gpu)
        if plan.ck_entry is None:
            c.states.pin(plan.ck_key)
        tail_block = plan.ck_entry is not None and len(plan.ck_entry.units) > 1
        new = c._allocate_blocks(len(from_tier) + tail_block)
        ck = None
        if new is not None and plan.ck_entry is not None:
            e = plan.ck_entry
            ck = c.states.reserve_checkpoint(plan.ck_key, e.num_tokens, e.priority, ident=e.ident)
            if ck is None:
                c.blocks.free(new)
                new = None
        if new is None:  # the GPU is too full to take it back now
            for e in entries:
                tiers.unpin(e)
            c.blocks.free(reversed(on_gpu), [HIGH] * len(on_gpu))
            if plan.ck_entry is None:
                c.states.unpin(plan.ck_key)
            return False
        # Targets in the order of the sources' tier locations, ascending: a run of consecutive
        # host locations then meets a run of consecutive GPU blocks where the pool has one, and
        # is copied straight into the pool (tier_store.TierStore._put). The chain does not care
        # which GPU block holds which of its blocks.
        new.sort()
        tail_target = new.pop() if tail_block else None
        by_loc = sorted(
            range(len(from_tier)), key=lambda i: (from_tier[i][1].tier, from_tier[i][1].units[0][1])
        )
        target = [0] * len(from_tier)
        for i, g in zip(by_loc, new, strict=True):
            target[i] = g
        loads, promoted = [], []
        for (k, e), g in zip(from_tier, target, strict=True):
            loads += tiers.loads(e, [g])
            promoted.append((g, k))
            self.inflight.add(k.hash)
            self.promoted_blocks[e.tier] += 1
        if plan.ck_entry is not None:
            e = plan.ck_entry
            gpu = [ck.slot] + ([tail_target] if tail_block else [])
            loads += tiers.loads(e, gpu)
            if tail_block:
                c._ckpt_block[plan.ck_key] = tail_target
                c._tails.setdefault(e.ident.parent, {})[plan.ck_key] = e.ident
            self.inflight.add(plan.ck_key)
            self.promoted_ckpts[e.tier] += 1
        it = iter(target)
        held = [g if g is not None else next(it) for _, g in chain]
        pr = _Promotion(self.next_id, req_id, held, promoted, entries, plan.ck_key, plan.ck_entry is not None)
        self.next_id += 1
        self.promotions[req_id] = self.by_id[pr.id] = pr
        self.transfers.append(Transfer(pr.id, tuple(loads)))
        return True

    def complete(self, transfer_id: int) -> None:
        """The runner reports the transfer's data on the GPU: make it a normal cached prefix."""
        c = self.c
        pr = self.by_id.pop(transfer_id)
        for e in pr.entries:
            c.tiers.unpin(e)
        for g, k in pr.promoted:
            got = c.blocks.cache(g, k)
            if got != g:  # computed meanwhile by another request: use that one, give ours back
                c.blocks.touch([got])
                c.blocks.free([g])
                pr.held[pr.held.index(g)] = got
            self.inflight.discard(k.hash)
        if pr.ck_promoted:
            c.states.pin(pr.ck_key)  # the hold's pin; commit drops the reservation's
            c.states.commit(pr.ck_key)
            self.inflight.discard(pr.ck_key)
        pr.done = True
        if pr.orphan:
            self._release(pr)

    def release(self, req_id: str) -> None:
        """The request was admitted (its hit holds the prefix now) or went away: drop the hold."""
        pr = self.promotions.pop(req_id, None)
        if pr is None:
            return
        if pr.done:
            self._release(pr)
        else:
            pr.orphan = True  # the targets are being written: released when the transfer ends

    def _release(self, pr: _Promotion) -> None:
        self.c.blocks.free(reversed(pr.held), [HIGH] * len(pr.held))
        self.c.states.unpin(pr.ck_key)

    def abandon(self, transfer_id: int) -> None:
        """The transfer never started (its step failed first): give its targets back; its request
        plans again from what is left."""
        c = self.c
        pr = self.by_id.pop(transfer_id)
        if self.promotions.get(pr.req_id) is pr:
            del self.promotions[pr.req_id]
        for e in pr.entries:
            c.tiers.unpin(e)
        targets = {g for g, _ in pr.promoted}
        for _, k in pr.promoted:
            self.inflight.discard(k.hash)
        kept = [g for g in reversed(pr.held) if g not in targets]
        c.blocks.free(kept, [HIGH] * len(kept))
        c.blocks.free(sorted(targets))
        if pr.ck_promoted:  # an unwritten reservation: unpinned, then dropped (with its block)
            self.inflight.discard(pr.ck_key)
        c.states.unpin(pr.ck_key)
        if pr.ck_promoted:
            c.states.drop_checkpoint(pr.ck_key)

    def release_others(self, keep: str) -> bool:
        """Give back the holds of every landed promotion but `keep`'s (their requests plan again
        later); True if any was released. Breaks the one deadlock holds can make: a request that
        cannot be admitted because waiting requests behind it hold the blocks it needs."""
        others = [rid for rid, pr in self.promotions.items() if rid != keep and pr.done]
        for rid in others:
            self.release(rid)
        return bool(others)

    def take_transfers(self) -> list[Transfer]:
        out, self.transfers = self.transfers, []
        return out

    @property
    def num_in_flight(self) -> int:
        return len(self.by_id)

    def stats(self) -> dict[str, int]:
        return {
            "promoted_blocks_host": self.promoted_blocks[HOST],
            "promoted_blocks_disk": self.promoted_blocks[DISK],
            "promoted_ckpts_host": self.promoted_ckpts[HOST],
            "promoted_ckpts_disk": self.promoted_ckpts[DISK],
            "transfers_in_flight": self.num_in_flight,
            "promotions_partial": self.num_partial,
        }


__all__ = ["BLOCK", "WAIT", "Promoter"]
