"""The engine step loop: scheduler -> model runner -> scheduler update -> outputs (text, stops)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch

from inference.cache.coordinator import CacheConfig, MMSpan
from inference.cache.records import PrefixLink
from inference.engine.graph_warmup import GraphWarmup, WarmupReport, warm_up
from inference.engine.model_runner import MMInputs, ModelRunner
from inference.engine.request import Request, RequestStatus, RequestTiming, SamplingParams, TokenLogprob
from inference.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from inference.engine.stops import TextStops
from inference.structured.runtime import GrammarRuntime
from inference.tokenizer import Tokenizer

KV_CACHE_DTYPES = ("auto", "fp8")  # auto: the model dtype; fp8: MLA latents as e4m3 + scales


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """The engine's whole configuration: the cache's and the scheduler's own configs, nested (each
    setting lives in the one config that uses it), plus what only the engine itself uses."""

    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=lambda: SchedulerConfig(max_num_seqs=32))
    enable_cuda_graphs: bool = True  # pure-decode steps replay captured graphs (CUDA, capable models)
    # steps of at most this many new tokens (a next agent turn, decodes beside it) replay graphs
    # too (0: decode steps only), while their absorbed attention reads at most
    # `short_graph_row_keys` (row, key) pairs; larger steps take the eager dense prefill path.
    # H200, 65-token turns: 10.5 ms in graphs vs 46 eager at 16K, 36.9 vs ~100 ms at 128K (8.6M
    # pairs); 16M covers what was measured (128 rows x 128K), longer contexts stay eager
    short_graph_tokens: int = 128
    short_graph_row_keys: int = 16 << 20
    # start-up capture of the common decode / short-step graph shapes (`graph_warmup`; off here,
    # on by default in `serve`)
    graph_warmup: GraphWarmup = field(default_factory=GraphWarmup)
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}")

    def evolve(self, **changes: Any) -> EngineConfig:
        """A copy with settings changed by name, wherever they live (`block_size=` goes to the
        cache config, `max_num_seqs=` to the scheduler's, ...); an unknown name is a TypeError."""
        own = {f.name for f in fields(self)}
        cache = {f.name for f in fields(CacheConfig)}
        sched = {f.name for f in fields(SchedulerConfig)}
        parts: dict[str, dict[str, Any]] = {"cache": {}, "scheduler": {}, "": {}}
        for name, value in changes.items():
            if name in own:
                parts[""][name] = value
            elif name in cache:
                parts["cache"][name] = value
            elif name in sched:
                parts["scheduler"][name] = value
            else:
                raise TypeError(f"no engine, cache or scheduler setting named {name!r}")
        base = replace(self, **parts[""]) if parts[""] else self
        return replace(
            base,
            cache=replace(base.cache, **parts["cache"]),
            scheduler=replace(base.scheduler, **parts["scheduler"]),
        )

    @classmethod
    def of(cls, **settings: Any) -> EngineConfig:
        """The default configuration with `settings` changed (see `evolve`)."""
        return cls().evolve(**settings)


@dataclass(slots=True)
class RequestOutput:
    """What changed for one request in one step (a streaming delta), plus its totals."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_output_tokens: int = 0
    new_logprobs: list[TokenLogprob] = field(default_factory=list)
    ttft_s: float | None = None
    arrival_time: float = 0.0  # time.monotonic() when the engine took the request
    timing: RequestTiming | None = None  # on the final output only


class Engine:
    """Synchronous engine: `add_request`, then `step()` until `has_unfinished` is False."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Tokenizer,
        config: EngineConfig,
        *,
        cache_spec: Any,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        runner: Any = None,
    ) -> None:
        """`runner`: a prebuilt stand-in for `ModelRunner` (the parallel driver's); `model` is
        then unused (None)."""
        self.config = config
        self.tokenizer = tokenizer
        self.memory_plan: Any = None  # the factory's MemoryPlan (how the pools were sized)
        self.model_dir: Path | None = None  # the checkpoint folder (None: random weights)
        self.image_token_id: int | None = None  # where image embeddings enter (vision models)
        self.scheduler = Scheduler(
            config.scheduler,
            config.cache,
            block_bytes=cache_spec.kv_bytes_per_token * config.cache.block_size,
            state_bytes=cache_spec.state_bytes_per_slot,
        )
        self.runner = runner or ModelRunner(
            model,
            cache_spec,
            num_blocks=config.cache.num_blocks,
            block_size=config.cache.block_size,
            num_slots=config.cache.num_state_slots,
            device=device,
            dtype=dtype,
            vocab_size=tokenizer.vocab_size,
            cuda_graphs=config.enable_cuda_graphs,
            short_graph_tokens=config.short_graph_tokens,
            short_graph_row_keys=config.short_graph_row_keys,
        )
        if (tiers := self.scheduler.cache.tiers) is not None:
            self.runner.attach_tiers(tiers.capacity, config.cache.tiers.disk_url)
        self.graph_warmup: WarmupReport | None = None
        graphs = getattr(self.runner, "graphs", None)
        if config.graph_warmup.enabled and graphs is not None:
            sched = config.scheduler
            self.graph_warmup = warm_up(
                config.graph_warmup, graphs, config.cache.block_size, sched.max_num_seqs, sched.max_model_len
            )
        self._text: dict[str, TextStops] = {}
        self.grammars: GrammarRuntime | None = None  # built with the first constrained request
        self._ids = itertools.count()
        # the requests of the step being run -> the position their work in it reaches
        self._in_step: dict[str, int] = {}
        # requests of a failed step -> the position each must pass running alone (see recover)
        self._suspects: dict[str, int] = {}
        self.num_generated_tokens = 0
        self.num_prompt_tokens_computed = 0
        self.num_steps = 0

    # -- requests --------------------------------------------------------------------------
    def add_request(
        self,
        prompt_token_ids: Sequence[int],
        sampling: SamplingParams | None = None,
        *,
        request_id: str | None = None,
        mm_spans: Sequence[MMSpan] = (),
        mm_inputs: MMInputs | None = None,
        eos_token_ids: Sequence[int] | None = None,
        message_ends: Sequence[int] = (),
        prefix_link: PrefixLink | None = None,
        handover: bool = False,
    ) -> str:
        """Queue a request (ValueError if it can never run: too long, bad tokens).
        `handover`: `prompt_token_ids` is a list the caller gives away: the request keeps it and
        appends its output to it (see `Request`), and the caller must not use it again; else it is
        copied. `prefix_link`: where the prompt comes from, from the layer that built it (the
        server's incremental chat path): the keys of the shared start are copied, not rebuilt, and
        its token ids, checked when that request was added, are not checked again."""
        rid = request_id or f"req-{next(self._ids)}"
        vocab = self.tokenizer.vocab_size
        ids = prompt_token_ids if handover and type(prompt_token_ids) is list else list(prompt_token_ids)
        if prefix_link is not None and prefix_link.num_shared > len(ids):
            raise ValueError(
                f"prefix_link shares {prefix_link.num_shared} tokens of a {len(ids)}-token prompt"
            )
        checked = 0
        if prefix_link is not None and prefix_link.extends in self.scheduler.cache.kept and not mm_spans:
            checked = prefix_link.num_shared
        new = ids[checked:] if checked else ids
        # min/max in C: a per-token Python check cost ~1 ms of a 16K agent turn's ~10 ms TTFT
        if new and (min(new) < 0 or max(new) >= vocab):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        req = Request(
            rid,
            ids,
            sampling or SamplingParams(),
            eos_token_ids=tuple(self.tokenizer.eos_token_ids if eos_token_ids is None else eos_token_ids),
            mm_spans=tuple(mm_spans),
            mm_inputs=mm_inputs,
            message_ends=tuple(message_ends),
            prefix_link=prefix_link,
        )
        if req.sampling.grammar is not None:
            if self.grammars is None:
                self.grammars = GrammarRuntime(self.tokenizer)
            self.grammars.add(rid, req.sampling.grammar, req.sampling.max_tokens)
        self.scheduler.add(req)
        self._text[rid] = TextStops(self.tokenizer, req)
        return rid

    def abort(self, request_ids: Sequence[str]) -> list[RequestOutput]:
        outs = []
        for rid in request_ids:
            req = self.scheduler.finish(rid, RequestStatus.FINISHED_ABORTED)
            if req is not None:
                outs.append(self._output(req, [], ""))
                self._cleanup(rid)
        return outs

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished

    def recover_after_failed_step(self) -> list[str]:
        """After an exception inside `step`: fail only the request that caused it. Returns the ids
        of the requests that failed (their state is gone; the caller tells their clients).

        A step that ran one request alone fails that request. A batched step cannot tell which
        of its requests broke it, so all of them are recomputed from their start (their output
        so far is kept, as after a preemption) and marked suspect: each then runs alone until it
        has recomputed past where the failed step had it (so the chunk or token that failed is
        re-run alone, also when it was not the request's first step), where a failure is its own.
        Requests outside the failed step keep their blocks and state. The prefix cache is dropped: the failed step may have left a reserved checkpoint
        unwritten. A failure with no request in the step is the engine's own: all fail."""
        if (dead := getattr(self.runner, "failure", None)) is not None:
            raise dead  # a lost parallel worker: no request can run again (WorkerFailedError)
        reached = {rid: end for rid, end in self._in_step.items() if rid in self.scheduler.requests}
        batch = list(reached)
        self._in_step = {}
        sched = self.scheduler
        if self.runner.unstarted:  # promotions the failed step never started: undo them
            sched.cache.abandon_transfers(self.runner.unstarted)
            self.runner.unstarted = []
        sched.cache.end_step()  # release the failed step's pins (a no-op if `update` ran)
        if not batch:
            failed = [*sched.requests]
            self.abort(failed)
            self._suspects.clear()
            sched.solo = None
            sched.reset_after_failure()
            return failed
        failed = batch if len(batch) == 1 else []
        self.abort(failed)
        for rid in batch:
            if rid not in failed:
                sched.requeue(rid)
                self.runner.tables.pop(rid, None)  # rebuilt on readmission, as after a preemption
                self._suspects[rid] = max(reached[rid], self._suspects.get(rid, 0))
        for rid in failed:
            self._suspects.pop(rid, None)
        sched.cache.reset_prefix_cache()
        self._next_solo()
        return failed

    def _next_solo(self) -> None:
        for rid in list(self._suspects):
            if rid in self.scheduler.requests:
                self.scheduler.solo = rid
                return
            del self._suspects[rid]
        self.scheduler.solo = None

    def get_request(self, rid: str) -> Request | None:
        return self.scheduler.requests.get(rid)

    # -- the loop --------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        sched_out, solo = self._schedule()
        reqs = dict(self.scheduler.requests)
        t0 = time.monotonic()
        sampled, logprobs = self.runner.execute(sched_out, reqs, self.token_masks(sched_out))
        if sched_out.is_empty and self.scheduler.num_transfers_in_flight:
            # nothing runnable before a promotion lands: wait for it rather than spin
            self.scheduler.transfers_done(self.runner.poll_transfers(wait=True))
        return self._complete(sched_out, solo, reqs, sampled, logprobs, t0)

    def token_masks(self, sched_out: SchedulerOutput) -> Any:
        """The grammar masks of the step's constrained requests, deferred: the runner computes them
        once the forward is launched (None when none is constrained)."""
        if self.grammars is None:
            return None
        return self.grammars.deferred([s.req_id for s in sched_out.scheduled if s.sample])

    def _schedule(
        self, busy: frozenset[str] = frozenset(), max_requests: int | None = None
    ) -> tuple[SchedulerOutput, str | None]:
        """The next step's scheduler output (see `Scheduler.schedule`), and the suspect it runs
        alone (if any); `_in_step` becomes its requests."""
        if self.scheduler.solo is not None and self.scheduler.solo not in self.scheduler.requests:
            self._next_solo()  # the suspect finished or was aborted meanwhile
        self.scheduler.transfers_done(self.runner.poll_transfers())
        sched_out = self.scheduler.schedule(busy, max_requests)
        self._in_step = {s.req_id: s.start + len(s.token_ids) for s in sched_out.scheduled}
        solo = self.scheduler.solo
        if solo is not None and not self._in_step:
            # The suspect cannot be scheduled now (no free blocks while others hold theirs):
            # give up isolating rather than stall; a new failure isolates again.
            self._suspects.clear()
            self.scheduler.solo = None
        return sched_out, solo

    def _complete(
        self,
        sched_out: SchedulerOutput,
        solo: str | None,
        reqs: dict[str, Request],
        sampled: dict[str, int],
        logprobs: dict[str, TokenLogprob],
        t0: float,
    ) -> list[RequestOutput]:
        """Apply a step's sampled tokens (`Scheduler.update`) and build its outputs; `_in_step`
        must be that step's requests."""
        t1 = time.monotonic()
        for s in sched_out.scheduled:
            if (r := reqs.get(s.req_id)) is not None:
                prefill = s.start < r.num_prompt_tokens  # prompt (or preemption recompute) chunk
                r.timing.record(t0, t1, len(s.token_ids), prefill, s.req_id in sampled)
        before = {rid: len(reqs[rid].output_token_ids) for rid in sampled}
        finished = {r.request_id: r for r in self.scheduler.update(sched_out, sampled, logprobs)}
        complete = self.grammars.consume(sampled) if self.grammars is not None else set()
        self.num_steps += 1
        self.num_prompt_tokens_computed += sum(len(s.token_ids) for s in sched_out.scheduled if not s.sample)
        self.num_generated_tokens += len(sampled)
        now = time.monotonic()
        outputs = []
        texts = self._text
        for rid in list(sampled) + [r for r in finished if r not in sampled]:
            req = reqs.get(rid) or finished[rid]
            out_ids = req.output_token_ids
            new_ids = out_ids[before.get(rid, len(out_ids)) :]
            if req.first_token_time is None and new_ids:
                req.first_token_time = now
            is_done = rid in finished
            stops = texts[rid]
            text, stop_now = stops.step(req, new_ids, is_done)
            if stop_now:  # a stop string: the request ends here (stops.py decides)
                self.scheduler.finish(rid, RequestStatus.FINISHED_STOPPED, stop_reason=stops.stopped)
                is_done = True
            elif rid in complete and not is_done:  # the grammar is complete: the answer is whole
                text += stops.push([], final=True)
                self.scheduler.finish(rid, RequestStatus.FINISHED_STOPPED)
                is_done = True
            lps = (
                req.logprobs[len(req.logprobs) - len(new_ids) :] if req.sampling.logprobs is not None else []
            )
            outputs.append(self._output(req, new_ids, text, lps))
            if is_done:
                outputs[-1].finished = True
                outputs[-1].finish_reason = req.finish_reason
                outputs[-1].stop_reason = req.stop_reason
                outputs[-1].timing = req.timing
                self._cleanup(rid)
        if solo is not None and solo in self._in_step:  # it ran alone and did not fail
            req = self.scheduler.requests.get(solo)
            if req is None or req.num_computed_tokens >= self._suspects.get(solo, 0):
                self._suspects.pop(solo, None)  # past the failed step's work: cleared
                self._next_solo()
        self._in_step = {}
        return outputs

    def _output(
        self, req: Request, ids: Sequence[int], text: str, lps: Sequence[TokenLogprob] = ()
    ) -> RequestOutput:
        ttft = None if req.first_token_time is None else req.first_token_time - req.arrival_time
        finished = req.status.finished
        return RequestOutput(
            req.request_id,
            ids if type(ids) is list else list(ids),  # callers pass fresh slices: no second copy
            text,
            finished,
            req.status.value if finished else None,
            req.stop_reason,
            req.num_prompt_tokens,
            max(req.num_cached_tokens, 0),
            len(req.output_token_ids),
            lps if type(lps) is list else list(lps),
            ttft,
            req.arrival_time,
            req.timing if finished else None,
        )

    def _cleanup(self, rid: str) -> None:
        self._text.pop(rid, None)
        if self.grammars is not None:
            self.grammars.drop(rid)
        self.runner.drop(rid)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[Request]:
        """Run prompts to completion (batched); returns the finished requests in input order."""
        params = sampling if isinstance(sampling, Sequence) else [sampling] * len(prompts)
        rids = [self.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
        done: dict[str, Request] = {}
        reqs = {rid: self.scheduler.requests[rid] for rid in rids}
        while self.has_unfinished:
            for o in self.step():
                if o.finished:
                    done[o.request_id] = reqs[o.request_id]
        return [done[r] for r in rids]

    def stats(self) -> dict[str, float]:
        graphs = self.runner.graphs
        return {
            **self.scheduler.stats(),
            "generated_tokens": self.num_generated_tokens,
            "prompt_tokens_computed": self.num_prompt_tokens_computed,
            "steps": self.num_steps,
            "decode_graphs": graphs.num_captured if graphs is not None else 0,
            "decode_graph_replays": graphs.num_replays if graphs is not None else 0,
            "graph_warmup_s": self.graph_warmup.seconds if self.graph_warmup is not None else 0.0,
        }
