"""The model runner: the only place in the engine that builds tensors.

Per step it (1) applies the scheduler's state operations in a fixed order — checkpoint -> live
copies, then zeroing of fresh live slots — (2) builds one `ForwardMeta` for the flat batch of
prefill chunks and decodes, (3) runs the model, (4) snapshots live slots into checkpoint slots
for the boundaries the step reached, and (5) samples the rows that caught up.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from inference.engine.cuda_graphs import DEFAULT_BATCH_BUCKETS, DecodeBatch, DecodeGraphs
from inference.engine.request import Request, TokenLogprob
from inference.engine.sampler import Sampler
from inference.engine.scheduler import ScheduledRequest, SchedulerOutput
from inference.model.cache_tensors import HybridCacheSpec, HybridCacheTensors
from inference.model.forward_meta import ForwardMeta, StepInputs


@dataclass(frozen=True, slots=True)
class MMInputs:
    """A request's image embeddings `[P, hidden]` and the prompt position of each row `[P]`."""

    embeds: torch.Tensor
    positions: torch.Tensor  # int64, ascending


class ModelRunner:
    samples = True  # False on a pipeline stage before the last: it computes no logits

    def __init__(
        self,
        model: torch.nn.Module,
        cache_spec: HybridCacheSpec,
        *,
        num_blocks: int,
        block_size: int,
        num_slots: int,
        device: torch.device | str,
        dtype: torch.dtype,
        vocab_size: int | None = None,
        cuda_graphs: bool = False,
        graph_batch_buckets: tuple[int, ...] = DEFAULT_BATCH_BUCKETS,
        short_graph_tokens: int = 0,
        short_graph_row_keys: int = 0,
    ) -> None:
        """`short_graph_tokens` / `short_graph_row_keys`: short steps replay graphs too where the
        model allows (`DecodeGraphs`' `short_tokens` / `short_row_keys`)."""
        self.model = model
        self.vocab_size = vocab_size  # the tokenizer's: ids past it (padded embedding rows) are never sampled
        self.device = torch.device(device)
        self.block_size = block_size
        supports = getattr(model, "supports_decode_graphs", None)
        use_graphs = cuda_graphs and self.device.type == "cuda" and supports is not None and supports(dtype)
        # decode graphs pad their batches into one extra block and one extra slot nobody owns
        extra = 1 if cuda_graphs else 0
        self.cache = HybridCacheTensors.allocate(
            cache_spec, num_blocks + extra, block_size, num_slots + extra, self.device, dtype
        )
        self.graphs: DecodeGraphs | None = None
        if use_graphs:
            short = getattr(model, "supports_short_step_graphs", None)
            if short is None or not short(dtype):
                short_graph_tokens = 0
            self.graphs = DecodeGraphs(
                model, self.cache, device=self.device, block_size=block_size,
                scratch_block=num_blocks, scratch_slot=num_slots, batch_buckets=graph_batch_buckets,
                vocab_size=vocab_size, short_tokens=short_graph_tokens, short_row_keys=short_graph_row_keys,
            )  # fmt: skip
        self.sampler = Sampler()
        self.tables: dict[str, list[int]] = {}
        self.forward_time = 0.0
        self.tier_store = None  # TierStore once `attach_tiers` ran (host/disk offload)
        self.unstarted: list[int] = []  # promotions of a step that failed before starting them

    def attach_tiers(self, capacity, disk_url: str = "") -> None:
        """Give the cache its host and disk tiers (`inference/engine/tier_store.py`)."""
        from inference.engine.tier_store import TierStore

        self.tier_store = TierStore(self.cache, capacity, disk_url)

    def poll_transfers(self, wait: bool = False) -> list[int]:
        """Promotions from the tiers whose data is on the device now (`wait`: block for one)."""
        return [] if self.tier_store is None else self.tier_store.poll(wait)

    def drop(self, req_id: str) -> None:
        self.tables.pop(req_id, None)
        self.sampler.forget(req_id)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy whole KV blocks (latent KV and indexer keys of every MLA layer), in list order."""
        for src, dst in pairs:
            self.cache.copy_block(src, dst)

    def _to(self, data: list[int], dtype: torch.dtype) -> torch.Tensor:
        t = torch.tensor(data, dtype=dtype)
        if self.device.type == "cuda":
            return t.pin_memory().to(self.device, non_blocking=True)
        return t

    def _table(self, s: ScheduledRequest) -> list[int]:
        """The sequence's block table after this step (not stored): new, extended by its blocks
        (a new list), or the same list object when it gained none (the decode graphs' host
        buffer skips a row that holds the list it held before; lists are never mutated)."""
        if s.is_new:
            return list(s.block_ids)
        return self.tables[s.req_id] + list(s.block_ids) if s.block_ids else self.tables[s.req_id]

    def _step_inputs(self, out: SchedulerOutput) -> StepInputs:
        """The host lists of a step (`StepInputs`), tables as they stand after it (not stored)."""
        seqs = out.scheduled
        return StepInputs.build(
            self.block_size,
            [len(s.token_ids) for s in seqs],
            [s.start for s in seqs],
            [self._table(s) for s in seqs],
            [s.slot for s in seqs],
            token_ids=[s.token_ids for s in seqs],
            sample=[s.sample for s in seqs],
        )

    def build_meta(self, out: SchedulerOutput) -> tuple[ForwardMeta, list[int], list[int]]:
        """ForwardMeta for the step, the flat input ids, and the batch rows of sampled requests."""
        step = self._step_inputs(out)
        for s, table in zip(out.scheduled, step.tables, strict=True):
            self.tables[s.req_id] = table
        return step.to_meta(self._to, step.logit_rows), step.ids, step.logit_rows

    def _image_embeds(self, out: SchedulerOutput, requests: Mapping[str, Request]) -> torch.Tensor | None:
        parts = []
        for s in out.scheduled:
            mm = requests[s.req_id].mm_inputs
            if mm is None:
                continue
            lo = int(torch.searchsorted(mm.positions, s.start))
            hi = int(torch.searchsorted(mm.positions, s.start + len(s.token_ids)))
            if hi > lo:
                parts.append(mm.embeds[lo:hi])
        return torch.cat(parts).to(self.device) if parts else None

    def _forward(
        self, out: SchedulerOutput, requests: Mapping[str, Request]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits of the sampled rows, and their greedy tokens when a captured graph ran the step
        (decode and short steps where one fits; else None)."""
        image_embeds = self._image_embeds(out, requests)
        g = self.graphs
        if g is not None and image_embeds is None:
            tokens = sum(len(s.token_ids) for s in out.scheduled)
            decode = tokens == len(out.scheduled)
            ran = None
            if decode or tokens <= g.max_short_tokens:
                batch, rows = self._graph_batch(out, decode)
                ran = g.run(batch)
            if ran is not None:
                logits, greedy = ran
                for s, table in zip(out.scheduled, batch.tables, strict=True):
                    self.tables[s.req_id] = table
                if len(rows) != len(batch.seq_lens):
                    return logits[rows], greedy[rows]
                return logits, greedy
        meta, ids, _ = self.build_meta(out)
        return self.model(self._to(ids, torch.int64), meta, self.cache, image_embeds=image_embeds), None

    def _graph_batch(self, out: SchedulerOutput, decode: bool) -> tuple[DecodeBatch, list[int]]:
        """Host lists of a step for the graphs (`decode`: one token per sequence), and the
        sequences to sample (tables not stored)."""
        st = self._step_inputs(out)
        q_lens = None if decode else st.query_lens
        batch = DecodeBatch(st.ids, st.positions, st.slot_mapping, st.seq_lens, st.tables, st.slots, q_lens)
        return batch, st.sample_seqs

    @torch.inference_mode()
    def execute(
        self, out: SchedulerOutput, requests: Mapping[str, Request], token_masks: Any = None
    ) -> tuple[dict[str, int], dict[str, TokenLogprob]]:
        """Run one scheduled step; returns sampled token ids (and logprobs where asked) by request.
        `token_masks`: grammar bitmasks by request id, or a callable computing them, called once
        the forward is launched (on a GPU the host computes them while the step runs)."""
        for rid in out.preempted:
            self.tables.pop(rid, None)
        if out.tier_ops is not None:  # first: it reads blocks and slots this step may overwrite
            self.unstarted = [t.id for t in out.tier_ops.transfers]
            self.tier_store.apply(out.tier_ops.ops)
        self.copy_blocks(out.block_copies)
        for src, dst in out.state_copies:
            self.cache.copy_slot(src, dst)
        if out.tier_ops is not None:  # after the copies: a deferred snapshot may read a target
            self.tier_store.start(out.tier_ops.transfers)
            self.unstarted = []
        for slot in out.state_zeros:
            self.cache.zero_slot(slot)
        if out.is_empty:
            return {}, {}
        t0 = time.perf_counter()
        logits, greedy = self._forward(out, requests)
        for src, dst in out.snapshots:
            self.cache.copy_slot(src, dst)
        self.copy_blocks(out.snapshot_block_copies)
        sampled_reqs = [s.req_id for s in out.scheduled if s.sample]
        if not sampled_reqs or not self.samples:
            self.forward_time += time.perf_counter() - t0
            return {}, {}
        params = [requests[r].sampling for r in sampled_reqs]
        allowed = token_masks() if callable(token_masks) else token_masks
        graph_vocab = None if self.graphs is None else self.graphs.vocab_size
        if (
            not allowed
            and greedy is not None
            and graph_vocab == self.vocab_size
            and all(p.greedy and p.logprobs is None for p in params)
        ):
            # the graph's argmax (captured over this vocabulary) is the sampler's greedy choice:
            # read back only the tokens
            tokens, lps = greedy.tolist(), [None] * len(params)
        else:
            if self.vocab_size is not None and logits.shape[-1] > self.vocab_size:
                logits = logits[:, : self.vocab_size]
            tokens, lps = self.sampler(logits, params, sampled_reqs, allowed)
        self.forward_time += time.perf_counter() - t0
        sampled = dict(zip(sampled_reqs, tokens, strict=True))
        logprobs = {r: lp for r, lp in zip(sampled_reqs, lps, strict=True) if lp is not None}
        return sampled, logprobs
