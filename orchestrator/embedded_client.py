"""The in-process engine of `inference` behind the `InferenceClient` protocol (the HTTP client is
`inference_client.OpenAIChatClient`). `inference` is imported lazily: the orchestrator runs
without torch until this client is built."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.inference_client import (
    AssistantTurn,
    InferenceCancelled,
    InferenceError,
    Sampling,
    chat_request_body,
    chat_span,
    parse_chat_completion,
    record_turn,
)


class EmbeddedChatClient:
    """The in-process engine of `inference`, behind the same protocol. It reads the workers'
    processed images from the blob store it was built with, so images go by reference."""

    def __init__(self, engine_client: Any, model: str):
        self._engine = engine_client
        self._model = model
        self.images_by_reference = bool(getattr(engine_client, "images_by_reference", False))
        self._aborted = threading.Event()
        self._in_flight: set[str] = set()  # this client's requests in the engine (it may be shared)
        self._lock = threading.Lock()

    @classmethod
    def default(cls, model: str, *, blob_url: str | None = None) -> EmbeddedChatClient:
        from inference.embedded import EmbeddedEngineClient  # lazy: torch loads only here

        return cls(EmbeddedEngineClient.default(model, blob_url=blob_url), model)

    def abort(self) -> None:
        """Abort the calls in flight (from another thread): the engine stops computing them and
        each raises `InferenceCancelled`, as a cut connection does for `OpenAIChatClient`."""
        self._aborted.set()
        with self._lock:
            ids = list(self._in_flight)
        for rid in ids:
            self._engine.abort(rid)

    def chat(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]], sampling: Sampling
    ) -> AssistantTurn:
        with chat_span(self._model, sampling, "dayzero.embedded") as span:
            t0 = time.perf_counter()
            self._aborted.clear()
            rid = f"embedded-{uuid.uuid4().hex}"
            with self._lock:
                self._in_flight.add(rid)
            try:
                data = self._engine.chat(
                    chat_request_body(self._model, messages, tools, sampling), request_id=rid
                )
            except (ValueError, TypeError) as exc:
                raise InferenceError(f"embedded engine rejected the request: {exc}", retryable=False) from exc
            except RuntimeError as exc:  # ChatAborted included: an abort is told apart below
                if self._aborted.is_set():
                    raise InferenceCancelled() from exc
                raise InferenceError(f"embedded engine failed: {exc}", retryable=True) from exc
            finally:
                with self._lock:
                    self._in_flight.discard(rid)
            if self._aborted.is_set():  # aborted before the engine took the request: drop the answer
                raise InferenceCancelled()
            turn = parse_chat_completion(data, (time.perf_counter() - t0) * 1000)
            record_turn(span, turn)
            return turn

    def close(self) -> None:
        close = getattr(self._engine, "close", None)
        if close is not None:
            close()
