"""A cancel aborts the embedded engine's model call: the engine drops the request (it stops
computing it and frees its blocks), the call raises `InferenceCancelled`, and the client serves
the next call. Real engine (the seeded random CPU model); the only stand-in adds `ignore_eos`, so
that the call would run for minutes by itself."""

from __future__ import annotations

import threading
import time

import pytest

from inference.embedded import EmbeddedEngineClient
from orchestrator.embedded_client import EmbeddedChatClient
from orchestrator.inference_client import InferenceCancelled, Sampling
from tests.orchestrator.conftest import wait_until


class _NoEos:
    """The real engine client, asked to ignore end-of-sequence (a call that does not end)."""

    def __init__(self, inner: EmbeddedEngineClient) -> None:
        self.inner = inner
        self.images_by_reference = False

    def chat(self, body, **kw):
        return self.inner.chat({**body, "ignore_eos": True}, **kw)

    def abort(self, request_id: str) -> None:
        self.inner.abort(request_id)

    def close(self) -> None:
        self.inner.close()


@pytest.fixture(scope="module")
def engine_client():
    inner = EmbeddedEngineClient.default("dayzero-small-random")
    yield inner
    inner.close()


def test_a_cancel_aborts_the_embedded_model_call_and_the_engine_stops_it(engine_client):
    engine = engine_client.engine.engine
    client = EmbeddedChatClient(_NoEos(engine_client), "dayzero-small-random")
    got: list[BaseException | object] = []

    def call() -> None:
        try:
            got.append(client.chat([{"role": "user", "content": "count"}], [], Sampling(max_tokens=20000)))
        except BaseException as exc:  # the test inspects what the call raised
            got.append(exc)

    t = threading.Thread(target=call, daemon=True)
    t.start()
    wait_until(lambda: engine.num_generated_tokens > 4, 60, "the call to decode")
    client.abort()
    t.join(60)
    assert not t.is_alive(), "the aborted call did not return"
    assert len(got) == 1 and isinstance(got[0], InferenceCancelled), got
    # the engine stopped computing it: nothing left in it, no more tokens generated
    wait_until(lambda: not engine.has_unfinished, 10, "the engine to drop the request")
    n = engine.num_generated_tokens
    time.sleep(0.2)
    assert engine.num_generated_tokens == n < 20000
    assert engine.scheduler.cache.num_request_blocks == 0
    # the next call is served (the abort ended only the call in flight), on this client and on a
    # client aborted while nothing was in flight
    sampling = Sampling(max_tokens=3)
    assert client.chat([{"role": "user", "content": "hi"}], [], sampling).usage.completion_tokens > 0
    idle = EmbeddedChatClient(engine_client, "dayzero-small-random")
    idle.abort()
    assert idle.chat([{"role": "user", "content": "hi"}], [], sampling).usage.completion_tokens > 0


def test_abort_of_an_id_not_in_flight_is_ignored(engine_client):
    engine_client.abort("no-such-request")
    out = engine_client.chat({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert out["choices"][0]["finish_reason"] in ("stop", "length")
