"""Pipeline parallelism inside a rank: the stage's part of the model, and its micro-batched step.

A stage holds the decoder layers `StagePlan.layers(p)` (`inference/analyze/stages.py`, the plan
`dayzero analyze` reports), the embedding on the first stage and the final norm and LM head on the
last; the other layers stay empty placeholders, so parameter names keep their checkpoint indices.
Its cache holds only its layers' KV blocks and recurrent states, at the block and slot ids the
driver's one coordinator hands out: every stage applies the same step's cache operations to its
own layers, so all stages agree on every prefix hit by construction (the hit rule, checkpoints and
tiers run once, in the driver).

A step is split into micro-batches (contiguous runs of its requests, balanced by tokens): stage
`p` runs micro-batch `i` while stage `p + 1` runs micro-batch `i - 1`. The hidden state after a
stage's last layer (`residual + x`, `[tokens, hidden]`, plus one row carrying the sender's
status) goes to the next stage's rank at the same `(ep, tp)` coordinates (`StageLink.send`,
asynchronous, waited at the end of the step); the receiver knows its shape from the step it was
sent. The last stage computes the logits
of the sampled rows and samples; the other stages sample nothing.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from inference.analyze.stages import StagePlan
from inference.engine.engine import Engine, RequestOutput
from inference.engine.model_runner import ModelRunner
from inference.engine.request import Request
from inference.engine.scheduler import ScheduledRequest, SchedulerOutput
from inference.model.cache_tensors import HybridCacheSpec
from inference.parallel.comm import StageLink

__all__ = ["PipelinedEngine", "StageRunner", "cut_stage", "micro_batches", "stage_cache_spec"]


class Elsewhere(nn.Module):
    """Placeholder of a decoder layer another pipeline stage holds (no parameters)."""


def stage_cache_spec(spec: HybridCacheSpec, plan: StagePlan, stage: int) -> HybridCacheSpec:
    """The cache of stage `stage`: only its layers' paged KV and recurrent states."""
    from dataclasses import replace

    mine = set(plan.layers(stage))
    return replace(
        spec,
        mla_layers=tuple(i for i in spec.mla_layers if i in mine),
        kda_layers=tuple(i for i in spec.kda_layers if i in mine),
    )


def cut_stage(
    model: nn.Module, full_names: list[str], plan: StagePlan, stage: int, elsewhere: set[str]
) -> None:
    """Drop from `model` (meta tensors, already TP/EP-sharded) what stage `stage` does not hold and
    add those names (of `full_names`, the whole model's) to `elsewhere` (skipped when loading)."""
    first, last = stage == 0, stage == plan.num_stages - 1
    layers = model.model.layers
    mine = plan.layers(stage)
    gone = [f"model.layers.{i}." for i in range(len(layers)) if i not in mine]
    for i in range(len(layers)):
        if i not in mine:
            layers[i] = Elsewhere()
    tied = model.spec.tie_word_embeddings
    if not first and not (last and tied):  # a tied LM head reads the embedding table
        model.model.embed_tokens = None
        gone.append("model.embed_tokens.")
    if not last:
        model.model.norm = None
        model.lm_head = None
        gone += ["model.norm.", "lm_head."]
    elsewhere.update(n for n in full_names if n.startswith(tuple(gone)))


def micro_batches(scheduled: list[ScheduledRequest], count: int) -> list[list[ScheduledRequest]]:
    """At most `count` contiguous non-empty runs of `scheduled`, balanced by tokens (the same
    split on every rank: it depends on the step alone)."""
    n = min(count, len(scheduled))
    if n <= 1:
        return [scheduled] if scheduled else []
    total = sum(len(s.token_ids) for s in scheduled)
    groups: list[list[ScheduledRequest]] = [[]]
    done = 0
    for i, s in enumerate(scheduled):
        left = len(scheduled) - i  # requests still to place, this one included
        need = n - len(groups)  # groups still to open after the current one
        full = done >= total * len(groups) / n and groups[-1]
        if groups[-1] and (full or left <= need):
            groups.append([])
        groups[-1].append(s)
        done += len(s.token_ids)
    return groups


class StageRunner(ModelRunner):
    """`ModelRunner` of one pipeline stage: the step's cache operations on this stage's pools as
    at world size 1, the forward as micro-batches through this stage's layers, sampling on the
    last stage only (eager: no decode graphs)."""

    def __init__(
        self, model: nn.Module, cache_spec: HybridCacheSpec, *, plan: StagePlan, link: StageLink,
        micro_batches: int, **kwargs,
    ) -> None:  # fmt: skip
        super().__init__(model, cache_spec, cuda_graphs=False, **kwargs)
        self.layers = [model.model.layers[i] for i in plan.layers(link.index)]
        self.link = link
        self.num_micro_batches = micro_batches
        self.samples = link.last
        self.dtype = next(p for p in model.parameters()).dtype
        self.hidden_size = model.spec.hidden_size
        self.waited = 0.0

    def _stage(self, x: Tensor, meta, cache) -> Tensor:
        residual = None
        for layer in self.layers:
            if hasattr(layer, "forward_split"):
                x, residual = layer.forward_split(x, residual, meta, cache)
            else:  # Qwen3-Next layers add their residuals themselves
                x = layer(x, meta, cache)
        return x if residual is None else residual + x

    def _forward(self, out: SchedulerOutput, requests: Mapping[str, Request]) -> tuple[Tensor | None, None]:
        """The step's micro-batches through this stage. Activations travel with one extra row
        whose first value is the sender's status (0 ok, 1 failed): a stage that raises still
        sends every micro-batch on (flagged), so the later stages fail the same step instead of
        waiting for it, and the driver sees a step every rank failed (isolated as under TP)."""
        link, model = self.link, self.model
        self.waited = 0.0  # seconds of this step spent waiting for the neighbouring stages
        logits: list[Tensor] = []
        sends = []
        failure: Exception | None = None
        for group in micro_batches(out.scheduled, self.num_micro_batches):
            part = SchedulerOutput(scheduled=group)
            meta, ids, _ = self.build_meta(part)
            meta.validate()
            n = meta.num_tokens
            h = None
            try:
                if link.first:
                    x = model.embed(self._to(ids, torch.int64), self._image_embeds(part, requests))
                else:
                    t0 = time.monotonic()
                    got = link.recv((n + 1, self.hidden_size), self.dtype, self.device)
                    self.waited += time.monotonic() - t0
                    if failure is None and float(got[n, 0]) != 0.0:
                        failure = RuntimeError("an earlier pipeline stage failed this step")
                    x = got[:n]
                if failure is None:
                    h = self._stage(x, meta, self.cache)
                    if link.last:
                        rows = h if meta.logits_indices is None else h[meta.logits_indices]
                        logits.append(model.lm_head(model.model.norm(rows)))
            except Exception as exc:
                failure = failure or exc
            if not link.last:
                status = torch.zeros(1, self.hidden_size, dtype=self.dtype, device=self.device)
                if failure is not None or h is None:
                    status[0, 0] = 1.0
                    h = torch.zeros(n, self.hidden_size, dtype=self.dtype, device=self.device)
                sends.append(link.send(torch.cat([h, status])))
        t0 = time.monotonic()
        for work in sends:
            work.wait()
        self.waited += time.monotonic() - t0
        if failure is not None:
            raise failure
        return (torch.cat(logits) if logits else None), None


@dataclass(slots=True)
class _Flight:
    """A step sent to the ranks and not collected yet."""

    out: SchedulerOutput
    solo: str | None
    reqs: dict[str, Request]
    reached: dict[str, int]  # its requests -> the position their work in it reaches
    t0: float


class PipelinedEngine(Engine):
    """`Engine` whose steps overlap through the pipeline stages: up to `depth` (the stage count)
    steps in flight, each a disjoint share of the requests (`Scheduler.schedule(busy=...,
    max_requests=...)`), so while the last stage finishes step `k` the first already runs `k + 1`
    and, in steady decode at a batch of at least `depth`, no stage waits for another's step. Each
    `step()` sends the next step while fewer than `depth` are in flight and returns the outputs of
    the oldest one once the pipeline is full (or nothing more can be scheduled); a request's next
    token is scheduled only after its step came back, so its tokens are the one-step engine's.

    Steps do not overlap (one at a time, as `Engine`) while a failed step's suspect runs alone or
    with offload tiers (whose copies and promotions are planned against the finished step)."""

    def __init__(self, *args, depth: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.depth = depth
        self._flights: deque[_Flight] = deque()
        self.max_in_flight = 0  # the most steps in flight at once (observed)

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished or bool(self._flights)

    def _overlap(self) -> bool:
        return self.depth > 1 and self.scheduler.solo is None and self.scheduler.cache.tiers is None

    def step(self) -> list[RequestOutput]:
        if not self._overlap():
            return self._collect() if self._flights else super().step()
        sent = False
        if len(self._flights) < self.depth:
            busy = frozenset(rid for f in self._flights for rid in f.reached)
            live = len(self.scheduler.running) + len(self.scheduler.waiting)
            out, solo = self._schedule(busy, max(1, -(-live // self.depth)))
            if _has_work(out):
                reqs = dict(self.scheduler.requests)
                t0 = time.monotonic()
                self.runner.submit(out, reqs, self.token_masks(out))
                self._flights.append(_Flight(out, solo, reqs, self._in_step, t0))
                self.max_in_flight = max(self.max_in_flight, len(self._flights))
                sent = True
            self._in_step = {}
        if self._flights and (len(self._flights) >= self.depth or not sent):
            return self._collect()
        return []

    def _collect(self) -> list[RequestOutput]:
        f = self._flights.popleft()
        self._in_step = f.reached  # a failure below is this step's (`recover_after_failed_step`)
        sampled, logprobs = self.runner.collect()
        # a request aborted while its step was in flight has had its outputs: drop its token
        live = self.scheduler.requests
        sampled = {r: t for r, t in sampled.items() if r in live}
        logprobs = {r: lp for r, lp in logprobs.items() if r in live}
        return self._complete(f.out, f.solo, f.reqs, sampled, logprobs, f.t0)


def _has_work(out: SchedulerOutput) -> bool:
    """Whether the ranks must run `out` (requests, or copies and zeroing a step carries)."""
    return bool(
        out.scheduled or out.block_copies or out.state_copies or out.state_zeros or out.preempted
        or out.snapshots or out.tier_ops is not None
    )  # fmt: skip
