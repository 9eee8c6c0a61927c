"""A generation request as the scheduler sees it: token ids, sampling parameters, progress."""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from inference.cache.coordinator import MMSpan
from inference.cache.records import PrefixLink

MAX_INT32 = 2**31 - 1
MIN_SAMPLING_TEMPERATURE = 1e-5


def _is_int(v: Any, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    def __init__(self, value: str) -> None:
        # a plain attribute, not a property: read several times per request per engine step
        self.finished: bool = value in ("stop", "length", "abort")


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Per-request sampling. temperature 0 is greedy; top_k 0 and top_p 1 disable those filters."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int = 16
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # None: none; 0: the chosen token's; k: plus the top k
    skip_special_tokens: bool = True
    grammar: str | None = None  # llguidance Lark grammar the output must follow (structured output)

    def __post_init__(self) -> None:
        # Every field is range-checked here, at admission: a value the sampler or the seeded
        # generator cannot take would otherwise fail the whole batched step it is part of.
        if (
            not (isinstance(self.temperature, int | float) and math.isfinite(self.temperature))
            or self.temperature < 0
        ):
            raise ValueError("temperature must be a finite number >= 0")
        if not _is_int(self.top_k, 0, MAX_INT32):
            raise ValueError(f"top_k must be an integer in [0, {MAX_INT32}] (0 disables it)")
        if not (isinstance(self.top_p, int | float) and 0.0 < self.top_p <= 1.0):
            raise ValueError("top_p must be in (0, 1]")
        if not _is_int(self.max_tokens, 1, MAX_INT32):
            raise ValueError(f"max_tokens must be an integer in [1, {MAX_INT32}]")
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError("min_tokens must be an integer in [0, max_tokens]")
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or not 0 <= self.logprobs <= 20):
            raise ValueError("logprobs must be an integer in [0, 20]")
        if self.seed is not None and not _is_int(self.seed, -(2**63), 2**64 - 1):
            raise ValueError("seed must be an integer in [-2^63, 2^64 - 1]")  # what a torch.Generator takes
        if len(self.stop_token_ids) > 64 or not all(_is_int(t, 0, MAX_INT32) for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be at most 64 integers in [0, {MAX_INT32}]")
        if self.grammar is not None and (not isinstance(self.grammar, str) or not self.grammar):
            raise ValueError("grammar must be a non-empty string")
        if any(not isinstance(s, str) or not s for s in self.stop) or len(self.stop) > 16:
            raise ValueError("stop must be at most 16 non-empty strings")

    @property
    def greedy(self) -> bool:
        # Below this, logits / temperature overflow to inf (NaN probabilities): it is greedy anyway.
        return self.temperature < MIN_SAMPLING_TEMPERATURE


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(slots=True)
class RequestTiming:
    """When a request's work happened (time.monotonic seconds), for traces and latency metrics:
    the engine records it, the server turns it into spans once the request finishes."""

    first_scheduled: float | None = None  # end of the queue wait
    prefill_chunks: list[tuple[float, float, int]] = field(default_factory=list)  # (start, end, tokens)
    decode_start: float | None = None
    decode_end: float | None = None
    decode_steps: int = 0
    token_times: list[float] = field(default_factory=list)  # when each output token was sampled

    def record(self, t0: float, t1: float, num_tokens: int, prefill: bool, sampled: bool) -> None:
        if self.first_scheduled is None:
            self.first_scheduled = t0
        if prefill:
            self.prefill_chunks.append((t0, t1, num_tokens))
        else:
            if self.decode_start is None:
                self.decode_start = t0
            self.decode_end = t1
            self.decode_steps += 1
        if sampled:
            self.token_times.append(t1)


@dataclass(eq=False)
class Request:
    """`token_ids` is the prompt when constructed, then the prompt followed by the output so far:
    the request owns that list from construction on and appends to it in place (no copy of a
    long prompt on the way in); whoever hands it over neither reads nor changes it again
    (`make_request` and `Engine.add_request` copy unless told the list is handed over)."""

    request_id: str
    token_ids: list[int]
    sampling: SamplingParams
    eos_token_ids: tuple[int, ...] = ()
    mm_spans: tuple[MMSpan, ...] = ()
    mm_inputs: Any = None  # opaque model inputs (image embeddings), consumed by the runner
    message_ends: tuple[int, ...] = ()  # prompt positions where chat messages end (checkpoint rule 4)
    prefix_link: PrefixLink | None = None  # the request whose prompt this one extends (cache/keys.py)
    arrival_time: float = field(default_factory=time.monotonic)
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    num_prompt_tokens: int = field(init=False)
    num_computed_tokens: int = 0
    num_cached_tokens: int = -1  # prefix hit at first admission (reported as cached_tokens)
    num_preemptions: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    stop_reason: int | str | None = None
    first_token_time: float | None = None
    timing: RequestTiming = field(default_factory=RequestTiming)

    def __post_init__(self) -> None:
        if not self.token_ids:
            raise ValueError("the prompt must have at least one token")
        self.num_prompt_tokens = len(self.token_ids)

    @property
    def prompt_token_ids(self) -> list[int]:
        """A copy of the prompt (O(prompt): for tests and reports, never the per-step path)."""
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def append_output(self, token_id: int, logprob: TokenLogprob | None = None) -> None:
        self.output_token_ids.append(token_id)
        self.token_ids.append(token_id)
        if logprob is not None:
            self.logprobs.append(logprob)

    @property
    def finish_reason(self) -> str | None:
        return self.status.value if self.status.finished else None


def make_request(
    request_id: str,
    prompt_token_ids: Sequence[int],
    sampling: SamplingParams | None = None,
    **kw: Any,
) -> Request:
    return Request(request_id, list(prompt_token_ids), sampling or SamplingParams(), **kw)
