"""Traces and Prometheus metrics of the inference server.

Traces: a request that carries a W3C `traceparent` (the orchestrator's GenAI client span) gets a
server span in that trace, with children for what the engine did: the queue wait, each prefill
chunk (the first says how many prompt tokens the prefix cache supplied) and the decode phase.
The engine thread only records times (`RequestTiming`); the spans are made here, with those
timestamps, once the request finished, so the engine loop never calls into OpenTelemetry.

Metrics: engine-wide figures (pools, queue, counters) are read from `Engine.stats()` at scrape
time; per-request latencies (TTFT, inter-token, queue wait, duration) are histograms observed
when a request finishes. docs/observability.md lists every name.

The SDK set-up is `core.telemetry`'s, shared with every other process.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from core.telemetry import install_tracer_provider as core_install

_PROPAGATOR = TraceContextTextMapPropagator()
_tracer = trace.get_tracer("dayzero.inference")


def install_tracer_provider(service_name: str = "dayzero-inference") -> None:
    """The one SDK set-up (`core.telemetry`) under the server's default service name."""
    core_install(service_name)


_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)


class _EngineCollector(Collector):
    """Engine-wide figures, read from `stats()` at scrape time."""

    def __init__(self, stats: Any) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Any]:
        s = self.stats()
        p = "dayzero_inference_"
        yield GaugeMetricFamily(p + "requests_running", "requests being computed", value=s["num_running"])
        yield GaugeMetricFamily(p + "requests_waiting", "requests queued", value=s["num_waiting"])
        usage = GaugeMetricFamily(
            p + "cache_usage_ratio", "fraction of a cache pool in use, per tier", labels=["pool", "tier"]
        )
        # Only the device tier exists so far (host and disk tiers are not built).
        usage.add_metric(["kv", "device"], s["kv_usage"])
        usage.add_metric(["state", "device"], s["state_usage"])
        yield usage
        yield GaugeMetricFamily(
            p + "state_checkpoints", "KDA state checkpoints held", value=s["num_checkpoints"]
        )
        yield GaugeMetricFamily(
            p + "prefix_cache_hit_ratio",
            "prompt tokens served from the prefix cache / prompt tokens admitted",
            value=s["prefix_hit_rate"],
        )
        yield CounterMetricFamily(
            p + "prompt_tokens_computed",
            "prompt tokens computed (prefill)",
            value=s["prompt_tokens_computed"],
        )
        yield CounterMetricFamily(p + "generation_tokens", "tokens generated", value=s["generated_tokens"])
        yield CounterMetricFamily(p + "engine_steps", "engine steps run", value=s["steps"])
        yield CounterMetricFamily(p + "preemptions", "requests preempted", value=s["num_preemptions"])
        yield GaugeMetricFamily(
            p + "decode_graphs", "captured decode CUDA graphs held", value=s["decode_graphs"]
        )
        yield CounterMetricFamily(
            p + "decode_graph_replays",
            "decode steps replayed from a CUDA graph",
            value=s["decode_graph_replays"],
        )


class ServerMetrics:
    """The server's registry: engine figures at scrape time plus per-request histograms."""

    def __init__(self, stats: Any) -> None:
        self.registry = r = CollectorRegistry()
        r.register(_EngineCollector(stats))
        p = "dayzero_inference_"
        self.requests = Counter(p + "requests", "requests by outcome", ["outcome"], registry=r)
        self.prompt_tokens = Counter(p + "prompt_tokens", "prompt tokens received", registry=r)
        self.cached_tokens = Counter(
            p + "cached_prompt_tokens", "prompt tokens the prefix cache supplied", registry=r
        )
        self.ttft = Histogram(
            p + "time_to_first_token_seconds", "arrival to first token", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.itl = Histogram(
            p + "inter_token_latency_seconds",
            "time between consecutive output tokens",
            buckets=_ITL_BUCKETS,
            registry=r,
        )
        self.queue = Histogram(
            p + "queue_wait_seconds", "arrival to first scheduled step", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.duration = Histogram(
            p + "request_duration_seconds", "arrival to last token", buckets=_LATENCY_BUCKETS, registry=r
        )

    def observe(self, last: Any) -> None:
        """A finished request (its final `RequestOutput`)."""
        self.requests.labels("ok" if last.finish_reason != "abort" else "aborted").inc()
        self.prompt_tokens.inc(last.num_prompt_tokens)
        self.cached_tokens.inc(last.num_cached_tokens)
        if last.ttft_s is not None:
            self.ttft.observe(last.ttft_s)
        t = last.timing
        if t is None:
            return
        if t.first_scheduled is not None:
            self.queue.observe(t.first_scheduled - last.arrival_time)
        for a, b in zip(t.token_times, t.token_times[1:], strict=False):
            self.itl.observe(b - a)
        if t.token_times:
            self.duration.observe(t.token_times[-1] - last.arrival_time)


def _epoch_ns(monotonic_s: float) -> int:
    return time.time_ns() - time.monotonic_ns() + int(monotonic_s * 1e9)


def record_request(
    headers: Mapping[str, str], route: str, started_ns: int, last: Any, model: str, error: str | None = None
) -> None:
    """The server span of one finished request and its engine-phase children (see the docstring)."""
    # FastAPI >= 0.165 makes the HTTP server span itself (from the request's headers): hang below
    # it. Without one, this span is the server span, continuing the header's context.
    in_server_span = trace.get_current_span().get_span_context().is_valid
    carrier = {k: v for k in ("traceparent", "tracestate") if (v := headers.get(k))}
    parent = None if in_server_span or not carrier else _PROPAGATOR.extract(carrier)
    t = last.timing if last is not None else None
    cached = last.num_cached_tokens if last is not None else 0
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": "text_completion" if route == "/v1/completions" else "chat",
        "gen_ai.request.model": model,
    }
    if route.startswith("/"):  # an HTTP request (else the in-process embedded client)
        attrs.update({"http.request.method": "POST", "http.route": route})
    if last is not None:
        attrs.update(
            {
                "gen_ai.usage.input_tokens": last.num_prompt_tokens,
                "gen_ai.usage.output_tokens": last.num_output_tokens,
                "gen_ai.usage.cache_read.input_tokens": cached,
                "gen_ai.response.finish_reasons": [last.finish_reason or ""],
                "dayzero.prefix_cache.hit": cached > 0,
                "dayzero.prefix_cache.hit_tokens": cached,
            }
        )
        if last.ttft_s is not None:
            attrs["dayzero.gen_ai.time_to_first_token_ms"] = last.ttft_s * 1000
    server = _tracer.start_span(
        "inference.request",
        context=parent,
        kind=SpanKind.INTERNAL if in_server_span else SpanKind.SERVER,
        start_time=started_ns,
        attributes=attrs,
    )
    if error is not None:
        server.set_attribute("error.type", "OpenAIError")
        server.set_status(Status(StatusCode.ERROR, error[:500]))
    ctx = trace.set_span_in_context(server)
    if last is not None and t is not None:
        arrival = _epoch_ns(last.arrival_time)
        _child(ctx, "inference.prepare", started_ns, arrival, {})
        if t.first_scheduled is not None:
            _child(ctx, "inference.queue_wait", arrival, _epoch_ns(t.first_scheduled), {})
        for i, (a, b, n) in enumerate(t.prefill_chunks):
            chunk = {"dayzero.prefill.chunk": i, "dayzero.prefill.tokens": n}
            if i == 0:
                chunk["dayzero.prefix_cache.hit_tokens"] = cached
            _child(ctx, "inference.prefill", _epoch_ns(a), _epoch_ns(b), chunk)
        if t.decode_start is not None and t.decode_end is not None:
            _child(
                ctx,
                "inference.decode",
                _epoch_ns(t.decode_start),
                _epoch_ns(t.decode_end),
                {
                    "dayzero.decode.steps": t.decode_steps,
                    "gen_ai.usage.output_tokens": last.num_output_tokens,
                },
            )
    server.end()


def _child(ctx: Any, name: str, start_ns: int, end_ns: int, attrs: dict[str, Any]) -> None:
    span = _tracer.start_span(name, context=ctx, start_time=start_ns, attributes=attrs)
    span.end(end_time=max(start_ns, end_ns))
