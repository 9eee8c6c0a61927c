"""Every task is one OpenTelemetry trace: runner spans and the model call share the task's trace."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from orchestrator.store import get_task
from orchestrator.tracing import valid_traceparent
from testing.otel import span_exporter
from tests.orchestrator.conftest import submit


@pytest.fixture(scope="module")
def spans() -> InMemorySpanExporter:
    return span_exporter()


def test_a_task_is_one_trace(spans, make_runner, db, model_server):
    spans.clear()
    given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    task_id = submit(db, {"cycles": 2, "tool": "echo"}, traceparent=given)
    other = submit(db, {"cycles": 1, "tool": "echo"})  # no context given: a new trace is minted
    before = len(model_server.traceparents)
    make_runner().run_until_idle(timeout_s=30)
    with db.connect() as conn:
        assert get_task(conn, task_id).traceparent == given
        minted = get_task(conn, other).traceparent
    assert valid_traceparent(minted) and minted.split("-")[1] != given.split("-")[1]
    trace_id = int(given.split("-")[1], 16)
    finished = spans.get_finished_spans()
    mine = [s for s in finished if s.attributes.get("dayzero.task_id") == task_id]
    steps = [s for s in mine if s.name.startswith("step.") and s.name != "step.transition"]
    assert [s.name for s in steps] == ["step.model", "step.tool", "step.model", "step.tool", "step.model"]
    assert {s.context.trace_id for s in mine} == {trace_id}
    assert all(s.parent.span_id == int("b7ad6b7169203331", 16) for s in steps)
    assert [s.attributes["dayzero.outcome"] for s in steps] == ["succeeded"] * 5
    assert [s.attributes["dayzero.tool.outcome"] for s in steps if s.name == "step.tool"] == ["ok", "ok"]
    # each model step made one GenAI client span, whose context the model server received
    by_id = {s.context.span_id: s for s in finished}
    chats = [
        s
        for s in finished
        if s.name == "chat scripted" and s.parent.span_id in {x.context.span_id for x in steps}
    ]
    assert len(chats) == 3 and all(by_id[c.parent.span_id].name == "step.model" for c in chats)
    assert all(c.attributes["gen_ai.request.model"] == "scripted" for c in chats)
    assert all(c.attributes["gen_ai.usage.input_tokens"] > 0 for c in chats)
    assert [c.attributes["gen_ai.response.finish_reasons"] for c in chats][-1] == ("stop",)
    # every state change of the task is a span of its trace
    moves = [
        (s.attributes["dayzero.from"], s.attributes["dayzero.to"])
        for s in mine
        if s.name == "task.transition"
    ]
    assert moves == [("PENDING", "READY"), ("READY", "RUNNING"), ("RUNNING", "SUCCEEDED")]
    step_moves = [s for s in mine if s.name == "step.transition"]
    assert len(step_moves) == 10  # five steps, each PENDING -> RUNNING -> SUCCEEDED
    seen = [tp for tp in model_server.traceparents[before:] if tp]
    assert sum(tp.split("-")[1] == given.split("-")[1] for tp in seen) == 3  # three model calls


def test_embedded_engine_phases_are_spans_of_the_model_step(spans):
    """The embedded default (no HTTP hop): the engine's phases hang below the GenAI client span."""
    from orchestrator.embedded_client import EmbeddedChatClient
    from orchestrator.inference_client import Sampling
    from orchestrator.tracing import task_span

    client = EmbeddedChatClient.default("dayzero-small-random")
    try:
        spans.clear()
        with task_span("00-" + "ab" * 16 + "-" + "cd" * 8 + "-01", "step.model") as step:
            turn = client.chat([{"role": "user", "content": "hi"}], [], Sampling(max_tokens=4))
    finally:
        client.close()
    got = {s.name: s for s in spans.get_finished_spans()}
    chat, request = got["chat dayzero-small-random"], got["inference.request"]
    assert chat.parent.span_id == step.get_span_context().span_id
    assert request.parent.span_id == chat.context.span_id
    assert chat.attributes["gen_ai.provider.name"] == "dayzero.embedded"
    assert chat.attributes["gen_ai.usage.output_tokens"] == turn.usage.completion_tokens > 0
    assert {"inference.queue_wait", "inference.prefill", "inference.decode"} <= {
        s.name for s in spans.get_finished_spans() if s.parent and s.parent.span_id == request.context.span_id
    }
