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
stage's last layer (`residual + x`, one `[tokens, hidden]` tensor) goes to the next stage's rank
at the same `(ep, tp)` coordinates (`StageLink.send`, asynchronous, waited at the end of the
step); the receiver knows its shape from the step it was sent. The last stage computes the logits
of the sampled rows and samples; the other stages sample nothing.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from inference.analyze.stages import StagePlan
from inference.engine.model_runner import ModelRunner
from inference.engine.request import Request
from inference.engine.scheduler import ScheduledRequest, SchedulerOutput
from inference.model.cache_tensors import HybridCacheSpec
from inference.parallel.comm import StageLink

__all__ = ["StageRunner", "cut_stage", "micro_batches", "stage_cache_spec"]


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

    def _stage(self, x: Tensor, meta, cache) -> Tensor:
        residual = None
        for layer in self.layers:
            if hasattr(layer, "forward_split"):
                x, residual = layer.forward_split(x, residual, meta, cache)
            else:  # Qwen3-Next layers add their residuals themselves
                x = layer(x, meta, cache)
        return x if residual is None else residual + x

    def _forward(self, out: SchedulerOutput, requests: Mapping[str, Request]) -> tuple[Tensor | None, None]:
        link, model = self.link, self.model
        logits: list[Tensor] = []
        sends = []
        for group in micro_batches(out.scheduled, self.num_micro_batches):
            part = SchedulerOutput(scheduled=group)
            meta, ids, _ = self.build_meta(part)
            meta.validate()
            if link.first:
                x = model.embed(self._to(ids, torch.int64), self._image_embeds(part, requests))
            else:
                x = link.recv((meta.num_tokens, self.hidden_size), self.dtype, self.device)
            h = self._stage(x, meta, self.cache)
            if link.last:
                if meta.logits_indices is not None:
                    h = h[meta.logits_indices]
                logits.append(model.lm_head(model.model.norm(h)))
            else:
                sends.append(link.send(h))
        for work in sends:
            work.wait()
        return (torch.cat(logits) if logits else None), None
