"""The scheduler: pure Python, no tensors.

One rule: every step, each scheduled request's `num_computed_tokens` catches up towards its
`num_tokens` by as many tokens as the budget (and the checkpoint cuts) allow. A fresh prompt, a
chunk of a long prompt, a decode step (one token), a prefix hit (num_computed starts at the hit)
and a preempted request being recomputed (num_computed reset to 0) are all that same rule.

A step = running requests first (oldest first), then admissions from the waiting queue while
the token budget and `max_num_seqs` allow; prefill chunks and decodes go in one batch. When
blocks run short for a running request, the most recently admitted running request is preempted
(its blocks and live slot are released; it is recomputed later, usually from its own prefix hit).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from inference.cache.coordinator import CacheConfig, HybridCacheCoordinator, PrefixHit
from inference.cache.tiers import TierOps
from inference.engine.request import Request, RequestStatus, TokenLogprob
from inference.engine.stops import token_stop

_NO_HIT = PrefixHit()  # a running request's allocation carries no hit (frozen: one shared instance)


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    enable_chunked_prefill: bool = True
    max_model_len: int = 8192

    def __post_init__(self) -> None:
        if self.max_num_seqs <= 0 or self.max_num_batched_tokens <= 0 or self.max_model_len <= 1:
            raise ValueError("scheduler limits must be positive")


class ScheduledRequest(NamedTuple):
    """One request's part of a step. Immutable; a NamedTuple, not a frozen dataclass, because one
    is built per running request per step and a frozen dataclass's __init__ costs ~4x more."""

    req_id: str
    token_ids: tuple[int, ...]  # the tokens computed in this step
    start: int  # their first position (num_computed_tokens before the step)
    block_ids: tuple[int, ...]  # is_new: the whole table; else only the blocks appended now
    slot: int
    is_new: bool  # first step since (re)admission: the runner (re)builds its table
    sample: bool  # the request catches up this step: sample its next token


@dataclass(slots=True)
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    # before the forward, in this order: block copies, state copies (both lists start with the
    # deferred end-of-generation snapshots of requests that finished last step), then zeros
    block_copies: list[tuple[int, int]] = field(default_factory=list)  # (src block, dst block)
    state_copies: list[tuple[int, int]] = field(default_factory=list)  # (src slot, dst slot)
    state_zeros: list[int] = field(default_factory=list)  # fresh live slots
    # after the forward: snapshots of this step's checkpoint positions
    snapshots: list[tuple[int, int]] = field(default_factory=list)  # (live slot, checkpoint slot)
    snapshot_block_copies: list[tuple[int, int]] = field(default_factory=list)  # (block, checkpoint's)
    preempted: list[str] = field(default_factory=list)
    # first of all: copies to and between the offload tiers, then promotions to start (tiers.py)
    tier_ops: TierOps | None = None

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        cache_config: CacheConfig,
        *,
        block_bytes: int = 1,
        state_bytes: int = 1,
    ) -> None:
        self.config = config
        self.cache = HybridCacheCoordinator(cache_config, block_bytes=block_bytes, state_bytes=state_bytes)
        self.B = cache_config.block_size
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.num_preemptions = 0
        # Isolation after a failed step (see Engine.recover_after_failed_step): while set, only
        # this request is scheduled, so a failure in that step is its own.
        self.solo: str | None = None
        self.prompt_tokens_admitted = 0
        self.cached_tokens_admitted = 0
        self._finished_early: list[Request] = []
        self._deferred: list = []  # end-of-generation snapshots to run first in the next step

    # -- requests --------------------------------------------------------------------------
    def check_request(self, req: Request) -> None:
        """Raise ValueError for a request that could never run here."""
        n = req.num_prompt_tokens
        if n >= self.config.max_model_len:
            raise ValueError(
                f"the prompt has {n} tokens; this model's context is {self.config.max_model_len} tokens"
            )
        if -(-(n + 1) // self.B) > self.cache.config.num_blocks:
            raise ValueError(f"the prompt has {n} tokens, more than the KV pool can ever hold")
        if not self.config.enable_chunked_prefill and n > self.config.max_num_batched_tokens:
            raise ValueError(
                f"the prompt has {n} tokens; without chunked prefill at most "
                f"{self.config.max_num_batched_tokens} fit in one step"
            )

    def add(self, req: Request) -> None:
        if req.request_id in self.requests:
            raise ValueError(f"duplicate request id {req.request_id!r}")
        self.check_request(req)
        if req.prefix_link is not None and not req.mm_spans:  # image keys are never linked
            self.cache.link(req.request_id, req.prefix_link)
        self.requests[req.request_id] = req
        self.waiting.append(req)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # -- one step --------------------------------------------------------------------------
    def _num_new(self, req: Request, budget: int, resumed: bool = False) -> int:
        """Tokens to compute for `req` this step; `resumed`: it is being admitted at a prefix hit."""
        remaining = len(req.token_ids) - req.num_computed_tokens
        if remaining <= 0:
            return 0
        if remaining == 1 and budget > 0:
            return 1  # a decode step: every checkpoint cut lies after num_computed, none shortens it
        if remaining > budget and not self.config.enable_chunked_prefill:
            n = remaining  # chunking off: whole pieces only (between checkpoint cuts)
        else:
            n = min(remaining, budget)
        cut = self.cache.next_prefill_cut(
            req.num_computed_tokens,
            req.num_prompt_tokens,
            req.message_ends,
            resumed_within=self.config.max_num_batched_tokens if resumed else 0,
        )
        if cut is not None and req.num_computed_tokens + n > cut:
            n = cut - req.num_computed_tokens
        return n if n <= budget else 0

    def _emit(self, out: SchedulerOutput, req: Request, n: int, alloc, is_new: bool) -> None:
        start = req.num_computed_tokens
        end = start + n
        if alloc.copy_from is not None:
            out.state_copies.append((alloc.copy_from, alloc.slot))
        if alloc.block_copy is not None:
            out.block_copies.append(alloc.block_copy)
        if alloc.zero:
            out.state_zeros.append(alloc.slot)
        blocks = tuple(self.cache.block_ids(req.request_id)) if is_new else alloc.new_block_ids
        tokens = req.token_ids
        out.scheduled.append(
            ScheduledRequest(
                req.request_id,
                tuple(tokens[start:end]),
                start,
                blocks,
                alloc.slot,
                is_new,
                end == len(tokens),
            )
        )
        snap = self.cache.plan_checkpoint(
            req.request_id, tokens, end, req.num_prompt_tokens, req.mm_spans, req.message_ends
        )
        if snap is not None:
            out.snapshots.append((snap.src_slot, snap.dst_slot))
            if snap.block_copy is not None:
                out.snapshot_block_copies.append(snap.block_copy)

    def schedule(
        self, busy: frozenset[str] = frozenset(), max_requests: int | None = None
    ) -> SchedulerOutput:
        """The next step. `busy`: requests in a step still running (pipeline parallelism keeps
        several steps in flight): not scheduled and never preempted until it is back (`update`);
        `max_requests`: at most this many requests in the step (a pipeline's share of the batch)."""
        out = SchedulerOutput()
        cap = self.config.max_num_seqs if max_requests is None else max_requests
        self.cache.begin_step()
        for snap in self._deferred:
            out.state_copies.append((snap.src_slot, snap.dst_slot))
            if snap.block_copy is not None:
                out.block_copies.append(snap.block_copy)
        self._deferred.clear()
        budget = self.config.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0 and len(out.scheduled) < cap:
            req = self.running[i]
            if (self.solo is not None and req.request_id != self.solo) or req.request_id in busy:
                i += 1
                continue
            n = self._num_new(req, budget)
            if n == 0:
                i += 1
                continue
            alloc = self.cache.allocate(req.request_id, _NO_HIT, req.num_computed_tokens, n)
            while alloc is None:
                victim = self._victim(busy)
                if victim is None:  # only requests still in flight hold blocks: wait for them
                    break
                self.running.remove(victim)
                self._preempt(victim, out)
                if victim is req:
                    break
                alloc = self.cache.allocate(req.request_id, _NO_HIT, req.num_computed_tokens, n)
            if alloc is None:
                if not self.running and -(-req.num_tokens // self.B) > self.cache.config.num_blocks:
                    # alone it still does not fit: the pool bounds its length
                    self._finished_early.append(self.finish(req.request_id, RequestStatus.FINISHED_LENGTH))
                break
            self._emit(out, req, n, alloc, is_new=False)
            budget -= n
            i += 1

        solo = self.requests.get(self.solo) if self.solo is not None else None
        if solo is not None and solo in self.waiting and self.waiting[0] is not solo:
            self.waiting.remove(solo)
            self.waiting.appendleft(solo)
        w = 0  # waiting requests whose prefix is arriving from a tier are passed over, in order
        while (
            w < len(self.waiting)
            and budget > 0
            and len(self.running) < self.config.max_num_seqs
            and len(out.scheduled) < cap
            and not out.preempted
            and (self.solo is None or self.waiting[w].request_id == self.solo)
        ):
            req = self.waiting[w]
            if not self.cache.prepare(req.request_id, req.token_ids, req.mm_spans):
                w += 1
                continue
            hit = self.cache.find_hit(req.request_id, req.token_ids, req.mm_spans)
            req.num_computed_tokens = hit.num_tokens
            n = self._num_new(req, budget, resumed=hit.num_tokens > 0)
            alloc = self.cache.allocate(req.request_id, hit, hit.num_tokens, n) if n else None
            if alloc is None:
                req.num_computed_tokens = 0
                if n and not self.running and self.cache.release_other_promotions(req.request_id):
                    continue  # the blocks it needs were held for requests behind it: try again
                break
            del self.waiting[w]
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = hit.num_tokens
                self.prompt_tokens_admitted += req.num_prompt_tokens
                self.cached_tokens_admitted += hit.num_tokens
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            self._emit(out, req, n, alloc, is_new=True)
            budget -= n
        out.tier_ops = self.cache.take_tier_ops()
        return out

    def _victim(self, busy: frozenset[str]) -> Request | None:
        """The most recently admitted running request not in flight (the one to preempt)."""
        for req in reversed(self.running):
            if req.request_id not in busy:
                return req
        return None

    def transfers_done(self, transfer_ids: list[int]) -> None:
        """The runner reports promotions finished: their requests may be admitted from now on."""
        self.cache.transfers_done(transfer_ids)

    @property
    def num_transfers_in_flight(self) -> int:
        return self.cache.num_transfers_in_flight

    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        self.cache.free(req.request_id, "preempted")
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)
        out.preempted.append(req.request_id)

    # -- after the step --------------------------------------------------------------------
    def update(
        self, out: SchedulerOutput, sampled: dict[str, int], logprobs: dict[str, TokenLogprob] | None = None
    ) -> list[Request]:
        """Advance every scheduled request; append sampled tokens; return newly finished ones."""
        finished, self._finished_early = self._finished_early, []
        requests, commit, max_len = self.requests, self.cache.commit, self.config.max_model_len
        for s in out.scheduled:
            req = requests.get(s.req_id)
            if req is None or req.status.finished:
                continue
            req.num_computed_tokens += len(s.token_ids)
            commit(req.request_id, req.token_ids, req.num_computed_tokens, req.mm_spans)
            if s.sample:
                tok = sampled[s.req_id]
                req.append_output(tok, None if logprobs is None else logprobs.get(s.req_id))
                status = token_stop(req, tok, max_len)
                if status is not None:
                    self.finish(req.request_id, status, stop_reason=req.stop_reason)
                    finished.append(req)
        self.cache.end_step()
        return finished

    def finish(
        self, req_id: str, status: RequestStatus, stop_reason: int | str | None = None
    ) -> Request | None:
        """End a request (stop, length or abort): its blocks and live slot go back to the pools."""
        req = self.requests.pop(req_id, None)
        if req is None:
            return None
        if req.status == RequestStatus.RUNNING:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        req.status = status
        req.stop_reason = stop_reason
        if status != RequestStatus.FINISHED_ABORTED and req.num_computed_tokens > 0:
            snap = self.cache.finish_checkpoint(req_id, req.token_ids, req.num_computed_tokens, req.mm_spans)
            if snap is not None:
                self._deferred.append(snap)
        self.cache.free(req_id, "aborted" if status == RequestStatus.FINISHED_ABORTED else "finished")
        self.cache.forget(req_id)
        return req

    def requeue(self, req_id: str) -> None:
        """After a failed step: free what the request holds and compute it again from its start
        (its output so far is kept), exactly as a preemption does."""
        req = self.requests.get(req_id)
        if req is None or req.status.finished:
            return
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.cache.free(req_id, "preempted")
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def reset_after_failure(self) -> None:
        """Drop every cached block and checkpoint (call with no requests left)."""
        self._deferred.clear()
        self.cache.begin_step()
        self.cache.end_step()
        self.cache.reset_prefix_cache()

    def abort(self, req_ids: Iterable[str]) -> None:
        for rid in req_ids:
            self.finish(rid, RequestStatus.FINISHED_ABORTED)

    def stats(self) -> dict[str, float]:
        c = self.cache
        return {
            "num_running": len(self.running),
            "num_waiting": len(self.waiting),
            # blocks held for the next turn of a conversation are given back on demand: not in use
            "kv_usage": (c.blocks.num_used - c.kept.num_held) / c.blocks.num_blocks,
            "prefix_blocks_held": c.kept.num_held,
            "prefix_keys_reused": c.kept.reused,
            "state_usage": c.states.usage(),
            "num_checkpoints": c.states.num_checkpoints,
            "num_preemptions": self.num_preemptions,
            "prefix_hit_rate": self.cached_tokens_admitted / self.prompt_tokens_admitted
            if self.prompt_tokens_admitted
            else 0.0,
            **c.tier_stats(),
        }
