"""The inference client protocol and its implementations.

`chat(messages, tools, sampling) -> AssistantTurn` with tool calls and usage (prompt, cached and
completion tokens, time to first token). Implementations:
- `OpenAIChatClient`: any OpenAI-compatible `/v1/chat/completions` server (ours, vLLM, SGLang).
- `EmbeddedChatClient` (`orchestrator/embedded_client.py`): the in-process engine of `inference`
  (imported lazily: the orchestrator must start without torch).
"""

from __future__ import annotations

import json
import socket
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import httpcore
import httpx
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from core.outage import DependencyUnavailable
from inference.wire import EXTENDS_FIELD
from orchestrator.inference_wire import UNKNOWN_TO_SERVER, ConversationMemo, WirePlan
from orchestrator.metrics import INFERENCE_REQUEST_BYTES, INFERENCE_WIRE
from orchestrator.tracing import trace_error, tracer

_PROPAGATOR = TraceContextTextMapPropagator()


class InferenceError(Exception):
    """The model call failed. `retryable` says whether the same call may succeed later."""

    def __init__(self, message: str, *, retryable: bool):
        super().__init__(message)
        self.retryable = retryable


class InferenceUnavailable(InferenceError, DependencyUnavailable):
    """The model server is down or restarting (connection refused or cut, 502/503/504, 429): an
    outage to wait out (`core.outage`), not a failed attempt of the step."""

    def __init__(self, message: str):
        super().__init__(message, retryable=True)


class ModelContextExceeded(InferenceError):
    """The server refused the prompt as longer than the model's context (`context_length_exceeded`):
    the same transcript can never fit, so the task fails with the typed `context_exceeded`."""

    def __init__(self, message: str):
        super().__init__(message, retryable=False)


class InferenceCancelled(InferenceError):
    """The call was aborted because its task was cancelled (`abort()`): nothing to record."""

    def __init__(self) -> None:
        super().__init__("the model call was aborted: the task was cancelled", retryable=False)


class _SocketTracker(httpcore.SyncBackend):
    """httpcore's network backend, remembering the sockets it opened so that `abort` can shut
    them down: closing a socket does not wake a thread blocked reading it, shutting it down does."""

    def __init__(self) -> None:
        self._socks: weakref.WeakSet[socket.socket] = weakref.WeakSet()

    def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore.NetworkStream:
        stream = super().connect_tcp(*args, **kwargs)
        if (sock := stream.get_extra_info("socket")) is not None:
            self._socks.add(sock)
        return stream

    def abort(self) -> None:
        for sock in list(self._socks):
            with suppress(OSError):  # already closed
                sock.shutdown(socket.SHUT_RDWR)


class _AbortableTransport(httpx.HTTPTransport):
    """`httpx.HTTPTransport` whose open connections `abort()` cuts (a cancelled task's request:
    the server sees the client go away and frees the request's slot)."""

    def __init__(self) -> None:
        super().__init__()
        self.sockets = _SocketTracker()
        self._pool = httpcore.ConnectionPool(network_backend=self.sockets)

    def abort(self) -> None:
        self.sockets.abort()


@dataclass(frozen=True, slots=True)
class Sampling:
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 1024
    seed: int | None = None
    # OpenAI's `prompt_cache_key`: one key per conversation (the task id), so a server that keeps
    # conversations (ours) tokenizes only each turn's new messages
    cache_key: str | None = None

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any] | None) -> Sampling:
        m = m or {}
        return cls(**{k: m[k] for k in ("temperature", "top_p", "max_tokens", "seed") if k in m})


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # raw JSON text as the model produced it; validated by the tool registry


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    ttft_ms: float | None = None
    # The host cost of the call before the engine (kept on the step row, where the agent-trace
    # benchmark reads it): bytes of the request body and how it went ("incremental" or "full",
    # with the reason), and the server's own timings (`dayzero.timings_ms`: parse, render, ...).
    request_bytes: int | None = None
    wire: str | None = None
    server_ms: Mapping[str, float] | None = None
    # host time on the runner before the request left: the step's own preparation (set by the
    # model step) and the client's (which messages to send, the JSON body)
    runner_ms: float | None = None
    encode_ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
            "ttft_ms": self.ttft_ms,
        }
        if self.request_bytes is not None:
            d["request_bytes"] = self.request_bytes
        if self.wire is not None:
            d["wire"] = self.wire
        if self.server_ms:
            d["server_ms"] = dict(self.server_ms)
        for k in ("runner_ms", "encode_ms"):
            if (v := getattr(self, k)) is not None:
                d[k] = round(v, 3)
        return d


@dataclass(frozen=True, slots=True)
class AssistantTurn:
    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str | None = None
    usage: Usage = field(default_factory=Usage)
    # Our server's word (`dayzero.tool_call_errors`) on tool calls it could not parse.
    tool_call_errors: tuple[str, ...] = ()

    def message(self) -> dict[str, Any]:
        """The transcript entry, in OpenAI chat format."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.tool_calls
            ]
        return msg


# Tool-call markup of the model families we know. A server that failed to parse a call leaves it
# in the content (third-party servers say nothing else); such a turn is not an answer.
TOOL_CALL_MARKUP = ("<|tool_call", "<|tool_calls_section", "<tool_call>", "<｜tool▁call", "<｜DSML｜")


def output_problem(turn: AssistantTurn) -> str | None:
    """What makes a model turn unusable, or None: tool calls the server could not parse, tool-call
    markup left in the content, or a final answer with nothing in it."""
    if turn.tool_call_errors:
        return "tool calls that could not be parsed: " + "; ".join(turn.tool_call_errors)[:800]
    content = turn.content or ""
    for marker in TOOL_CALL_MARKUP:
        if marker in content:
            return f"tool-call markup ({marker!r}) in the answer: a tool call that could not be parsed"
    if not turn.tool_calls and not content.strip():
        return "an empty answer (no content and no tool calls)"
    return None


@contextmanager
def chat_span(model: str, sampling: Sampling, provider: str, **attrs: Any) -> Iterator[Any]:
    """The GenAI client span of one chat call (OpenTelemetry GenAI semantic conventions); its
    context is what the model server continues. `record_turn` fills in the response side."""
    with tracer.start_as_current_span(
        f"chat {model}",
        kind=SpanKind.CLIENT,
        attributes={
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": model,
            "gen_ai.request.temperature": sampling.temperature,
            "gen_ai.request.top_p": sampling.top_p,
            "gen_ai.request.max_tokens": sampling.max_tokens,
            **attrs,
        },
    ) as span:
        try:
            yield span
        except InferenceError as exc:
            trace_error(span, "InferenceError", str(exc))
            raise


def record_turn(span: Any, turn: AssistantTurn) -> None:
    u = turn.usage
    span.set_attributes(
        {
            "gen_ai.usage.input_tokens": u.prompt_tokens,
            "gen_ai.usage.output_tokens": u.completion_tokens,
            "gen_ai.usage.cache_read.input_tokens": u.cached_tokens,
            "gen_ai.response.finish_reasons": [turn.finish_reason or ""],
            "dayzero.gen_ai.tool_calls": len(turn.tool_calls),
        }
    )
    if u.ttft_ms is not None:
        span.set_attribute("dayzero.gen_ai.time_to_first_token_ms", float(u.ttft_ms))


class InferenceClient(Protocol):
    # True when the server loads the workers' processed images from the shared blob store
    # (`dayzero-processed:<sha256>` image URLs); False: it is sent image bytes.
    images_by_reference: bool

    def chat(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]], sampling: Sampling
    ) -> AssistantTurn: ...

    def close(self) -> None: ...


def parse_chat_completion(body: Mapping[str, Any], ttft_ms: float | None) -> AssistantTurn:
    """Turn an OpenAI chat-completion response into an `AssistantTurn`.

    A malformed tool call (missing name, non-string arguments) is kept as a call the tool registry
    will reject with an error the model can read, never dropped and never a crash.
    """
    try:
        choice = body["choices"][0]
        msg = choice["message"]
    except (KeyError, IndexError, TypeError):
        raise InferenceError(f"malformed chat completion: {str(body)[:200]}", retryable=True) from None
    calls = []
    for i, raw in enumerate(msg.get("tool_calls") or []):
        fn = raw.get("function") or {} if isinstance(raw, Mapping) else {}
        args = fn.get("arguments", "")
        if not isinstance(args, str):
            args = json.dumps(args)
        calls.append(
            ToolCall(
                id=str((raw.get("id") if isinstance(raw, Mapping) else None) or f"call_{i}"),
                name=str(fn.get("name") or ""),
                arguments=args,
            )
        )
    usage = body.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    ext = body.get("dayzero") or {}
    errors = ext.get("tool_call_errors") if isinstance(ext, Mapping) else None
    timings = ext.get("timings_ms") if isinstance(ext, Mapping) else None
    return AssistantTurn(
        content=msg.get("content"),
        tool_calls=tuple(calls),
        finish_reason=choice.get("finish_reason"),
        tool_call_errors=tuple(str(e) for e in errors) if isinstance(errors, list) else (),
        usage=Usage(
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            cached_tokens=int(details.get("cached_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            ttft_ms=ext.get("ttft_ms", ttft_ms),
            server_ms=dict(timings) if isinstance(timings, Mapping) else None,
        ),
    )


def kept_messages(body: Mapping[str, Any]) -> int | None:
    """How many messages the server says it keeps under the request's key (`dayzero.conversation`)."""
    conv = (body.get("dayzero") or {}).get("conversation") if isinstance(body, Mapping) else None
    n = conv.get("messages") if isinstance(conv, Mapping) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def chat_request_body(
    model: str,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]],
    sampling: Sampling,
    extends: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": list(messages),
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "max_tokens": sampling.max_tokens,
    }
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    if sampling.cache_key is not None:
        body["prompt_cache_key"] = sampling.cache_key
    if extends is not None:
        body[EXTENDS_FIELD] = extends
    if tools:
        body["tools"] = list(tools)
        body["tool_choice"] = "auto"
    return body


class _ConversationUnknown(Exception):
    """409 `conversation_unknown`: the server lacks the base an incremental request extends."""


def _error_code(resp: httpx.Response) -> str | None:
    try:
        err = resp.json().get("error") or {}
    except (ValueError, AttributeError):
        return None
    return err.get("code") if isinstance(err, Mapping) else None


class OpenAIChatClient:
    """Chat completions over HTTP. Retries are the runner's business, so none happen here."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 300.0,
        images_by_reference: bool = False,
    ):
        self.images_by_reference = images_by_reference
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # OpenAI clients are configured with the `/v1` base; requests here name the full path.
        base = base_url.rstrip("/").removesuffix("/v1")
        self._transport = _AbortableTransport()
        self._http = httpx.Client(
            base_url=base, headers=headers, timeout=timeout_s, transport=self._transport
        )
        self._model = model
        self._aborted = threading.Event()
        # what the server keeps of each conversation: later turns send only new messages
        self.conversations = ConversationMemo()

    def abort(self) -> None:
        """Abort the call in flight (from another thread): it raises `InferenceCancelled`."""
        self._aborted.set()
        self._transport.abort()

    def chat(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]], sampling: Sampling
    ) -> AssistantTurn:
        url = self._http.base_url
        with chat_span(
            self._model, sampling, "openai", **{"server.address": url.host, "server.port": url.port or 0}
        ) as span:
            t0 = time.perf_counter()
            key = sampling.cache_key
            plan = self.conversations.plan(key, messages)
            try:
                turn, kept = self._chat(
                    chat_request_body(self._model, plan.messages, tools, sampling, plan.extends), t0
                )
                wire = "incremental" if plan.extends is not None else f"full:{plan.reason or 'no_key'}"
            except _ConversationUnknown:  # the server lacks the base: the whole transcript, once
                assert key is not None
                self.conversations.forget(key)
                plan = WirePlan(list(messages), None, UNKNOWN_TO_SERVER)
                turn, kept = self._chat(
                    chat_request_body(self._model, plan.messages, tools, sampling), time.perf_counter()
                )
                wire = f"full:{UNKNOWN_TO_SERVER}"
            INFERENCE_WIRE.labels(wire).inc()
            INFERENCE_REQUEST_BYTES.labels(wire.split(":")[0]).inc(turn.usage.request_bytes or 0)
            if key is not None:
                if kept is not None and kept == len(messages):
                    self.conversations.kept(key, messages, kept)
                else:
                    self.conversations.forget(key)
            turn = replace(turn, usage=replace(turn.usage, wire=wire))
            record_turn(span, turn)
            return turn

    def _chat(self, body: dict[str, Any], started: float) -> tuple[AssistantTurn, int | None]:
        """One request; the turn (with the request's size) and what the server keeps of it."""
        headers: dict[str, str] = {"content-type": "application/json"}
        _PROPAGATOR.inject(headers)  # the task's trace continues on the model server
        content = json.dumps(body, ensure_ascii=False).encode()
        t0 = time.perf_counter()
        encode_ms = (t0 - started) * 1000.0
        self._aborted.clear()
        try:
            resp = self._http.post("/v1/chat/completions", content=content, headers=headers)
        except httpx.TransportError as exc:
            if self._aborted.is_set():
                raise InferenceCancelled() from exc
            if isinstance(exc, httpx.TimeoutException):
                # Slow, not gone: a failed attempt (the same request may be too big to finish in time).
                raise InferenceError(f"inference server timed out: {exc}", retryable=True) from exc
            # refused, reset, or closed mid-answer (a restart)
            raise InferenceUnavailable(f"inference server unreachable: {exc}") from exc
        except httpx.HTTPError as exc:
            raise InferenceError(f"inference request failed: {exc}", retryable=True) from exc
        elapsed_ms = (time.perf_counter() - t0) * 1000
        if resp.status_code in (429, 502, 503, 504):  # overloaded, starting, or behind a proxy that lost it
            raise InferenceUnavailable(
                f"inference server unavailable ({resp.status_code}): {resp.text[:300]}"
            )
        if resp.status_code >= 500:
            raise InferenceError(
                f"inference server error {resp.status_code}: {resp.text[:300]}", retryable=True
            )
        if resp.status_code == 409 and _error_code(resp) == UNKNOWN_TO_SERVER:
            raise _ConversationUnknown()
        if resp.status_code == 400 and _error_code(resp) == "context_length_exceeded":
            raise ModelContextExceeded(f"the model's context is too small for this prompt: {resp.text[:300]}")
        if resp.status_code >= 400:
            raise InferenceError(
                f"inference request rejected {resp.status_code}: {resp.text[:300]}", retryable=False
            )
        try:
            data = resp.json()
        except ValueError:
            raise InferenceError(
                f"inference server sent non-JSON: {resp.text[:200]}", retryable=True
            ) from None
        turn = parse_chat_completion(data, elapsed_ms)
        turn = replace(turn, usage=replace(turn.usage, request_bytes=len(content), encode_ms=encode_ms))
        return turn, kept_messages(data)

    def close(self) -> None:
        self._http.close()
